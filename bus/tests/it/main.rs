//! The integration tests of gearshift-bus, one binary (linked once).
//!
//! | module | what |
//! | --- | --- |
//! | `conformance` | the same cases for every transport (memory, AMQP and STOMP on RabbitMQ, STOMP on ActiveMQ) |
//! | `activemq` | ActiveMQ Classic: URLs, flavor detection, idle heart-beats, a refused subscription |
//! | `oversized` | an oversized message followed by a good one, per transport |
//! | `amqp_transport` | AMQP outages, connection errors, TLS, against the real RabbitMQ |
//! | `amqp_throughput` | publish rates (ignored: a benchmark) |
//! | `stomp_rabbitmq` | STOMP against RabbitMQ's STOMP plugin |
//! | `stomp_session` | session behaviour against the in-process broker |
//! | `stomp_heartbeat` | heart-beats with paused time |
//! | `stomp_tls` | `stomp+ssl://` with a private CA |
//! | `stomp_codec_props` | property tests of the codec |
//! | `stomp_support` | the in-process STOMP broker |
//! | `rabbit` | the real RabbitMQ: URLs, `rabbitmqctl`, unique names |
//! | `proxy` | a TCP proxy that cuts only this test's connections |
//!
//! Tests whose name contains `disruptive` make the broker drop every
//! connection; the test script runs them in a separate, serial pass.

mod activemq;
mod amqp_throughput;
mod amqp_transport;
mod conformance;
mod oversized;
mod proxy;
mod rabbit;
mod stomp_codec_props;
mod stomp_heartbeat;
mod stomp_rabbitmq;
mod stomp_session;
mod stomp_support;
mod stomp_tls;
