//! Integration tests of pushstats: the shipped examples and Heat templates.
//!
//! One test binary with a module per former `tests/*.rs` file: the
//! workspace is linked once for all of them (cargo's advice for large
//! suites). Each module's own doc says what it tests.

mod examples;
mod heat_templates;
