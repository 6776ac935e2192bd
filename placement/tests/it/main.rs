//! Integration tests of the placement engine: configuration, strategies,
//! seeds, properties.
//!
//! One test binary with a module per former `tests/*.rs` file: the
//! workspace is linked once for all of them (cargo's advice for large
//! suites). Each module's own doc says what it tests.

mod config_and_evacuation;
mod fixtures;
mod operator_strategies;
mod properties;
mod seed_examples;
mod shipped_strategies;
