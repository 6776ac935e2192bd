//! `[saga]`: deadlines and retries of the scale-up and scale-down sagas.

use std::time::Duration;

use gearshift_service::check::at_least;
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};

use super::MIN_PERIOD;

/// `[saga]`: deadlines and retries of each step.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SagaConfig {
    /// `expires` of commands sent to nodes. Default `10m`.
    #[serde(with = "duration")]
    pub command_ttl: Duration,
    /// How long a node has to answer `cmd.deactivate`, `cmd.inventory` or
    /// `cmd.activate` before the command is sent again. Default `2m`.
    #[serde(with = "duration")]
    pub command_timeout: Duration,
    /// Sends of one command before the step fails. Default `3`.
    pub command_attempts: u32,
    /// Deadline of one evacuation (the drain deadline). Default `15m`.
    #[serde(with = "duration")]
    pub evacuation_timeout: Duration,
    /// Evacuation rounds (re-plan what is left) before the saga aborts. Default `3`.
    pub evacuation_attempts: u32,
    /// Moves in flight at once on the draining node. Default `4`.
    pub evacuation_parallelism: u32,
    /// How long to wait for a report that shows the node empty. Default `2m`.
    #[serde(with = "duration")]
    pub confirm_empty_timeout: Duration,
    /// How long a removal may take until the node is confirmed gone. Default `15m`.
    #[serde(with = "duration")]
    pub remove_timeout: Duration,
    /// How often the handler is asked whether a removed node is gone. Default `30s`.
    #[serde(with = "duration")]
    pub presence_poll: Duration,
    /// Bound on one handler call. Default `2m`.
    #[serde(with = "duration")]
    pub handler_timeout: Duration,
    /// Create requests per scale-up (retried only when the cloud certainly
    /// created nothing). Default `3`.
    pub create_attempts: u32,
    /// Finished operations kept for `status`. Default `200`.
    pub history: usize,
    /// With `[paas] kind = "openshift"`: how long after a retryable failure
    /// (a timeout, an unreachable node) a district command or a gear move
    /// runs again; `command_attempts` bounds the runs. Default `10s`.
    #[serde(with = "duration")]
    pub paas_retry: Duration,
}

impl Default for SagaConfig {
    fn default() -> Self {
        SagaConfig {
            command_ttl: Duration::from_secs(600),
            command_timeout: Duration::from_secs(120),
            command_attempts: 3,
            evacuation_timeout: Duration::from_secs(900),
            evacuation_attempts: 3,
            evacuation_parallelism: 4,
            confirm_empty_timeout: Duration::from_secs(120),
            remove_timeout: Duration::from_secs(900),
            presence_poll: Duration::from_secs(30),
            handler_timeout: Duration::from_secs(120),
            create_attempts: 3,
            history: 200,
            paas_retry: Duration::from_secs(10),
        }
    }
}

impl SagaConfig {
    /// Checks the section; keys in errors start with `saga.`.
    pub fn check(&self) -> Result<(), Invalid> {
        let s = self;
        at_least("saga.command_ttl", s.command_ttl, MIN_PERIOD)?;
        at_least("saga.command_timeout", s.command_timeout, MIN_PERIOD)?;
        at_least("saga.evacuation_timeout", s.evacuation_timeout, MIN_PERIOD)?;
        at_least(
            "saga.confirm_empty_timeout",
            s.confirm_empty_timeout,
            MIN_PERIOD,
        )?;
        at_least("saga.remove_timeout", s.remove_timeout, MIN_PERIOD)?;
        at_least("saga.presence_poll", s.presence_poll, MIN_PERIOD)?;
        at_least("saga.handler_timeout", s.handler_timeout, MIN_PERIOD)?;
        at_least("saga.paas_retry", s.paas_retry, MIN_PERIOD)?;
        if s.command_attempts == 0 || s.evacuation_attempts == 0 || s.create_attempts == 0 {
            return Err(Invalid::new(
                "saga.command_attempts",
                "command_attempts, evacuation_attempts and create_attempts must be at least 1",
            ));
        }
        if !(1..=256).contains(&s.evacuation_parallelism) {
            return Err(Invalid::new(
                "saga.evacuation_parallelism",
                "must be 1..=256",
            ));
        }
        Ok(())
    }
}
