//! Unit tests of the node core.
