//! gearshift's cross-crate integration tests: real RabbitMQ over AMQP and
//! STOMP, in-process OpenStack API servers, the agents' binaries.
//!
//! One test binary with a module per former `tests/*.rs` file: the
//! workspace is linked once for all of them (cargo's advice for large
//! suites). Each module's own doc says what it tests.

mod activemq_agents;
mod broker_kill;
mod broker_reload;
mod broker_sagas;
mod bus_least_privilege;
mod chaos_disruptive;
mod cloud_keystone_heat;
mod dashboard_browser;
mod demo_transports;
mod enroll_token;
mod ha_disruptive;
mod ha_election;
mod handlers_e2e;
mod handlers_heat_magnum;
mod handlers_heat_via_node;
mod handlers_local;
mod handlers_nova;
mod heat_user_data;
mod hostile;
mod node_cli;
mod node_commands;
mod node_evacuation_kill;
mod node_heat;
mod node_outage;
mod openshift_join;
mod openshift_scale_down;
mod openstack_conformance;
mod packaging_rpm;
mod placement_bus;
mod pushstats_agents;
mod pushstats_cloudwatch;
mod pushstats_docs;
mod pushstats_gnocchi;
mod pushstats_pusher;
mod python_client;
mod sim_replay;
mod trust_identity;
