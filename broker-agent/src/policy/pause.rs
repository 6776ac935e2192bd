//! An operator's pause: the group (or the whole fleet) decides nothing, but
//! its evaluation is still explained, with what it would have done.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::Outcome;

use super::{GroupVerdict, reason};
use crate::ops::Pause;

/// `v` with nothing to carry out: no scale-up, no drain cancel, no drain;
/// the explanation names the pause first. The stabilization window keeps
/// what it was (`underused_since`), so resuming does not drain at once.
pub(super) fn hold(
    mut v: GroupVerdict,
    p: &Pause,
    fleet: bool,
    underused_since: Option<DateTime<Utc>>,
) -> GroupVerdict {
    let who = if fleet { "fleet " } else { "" };
    let pause = format!("{who}{}", p.describe());
    let x = &mut v.explanation;
    let wanted = !matches!(x.outcome, Outcome::None);
    x.reasons.insert(0, reason("paused", false, pause.clone()));
    x.summary = if wanted {
        format!("{pause}; otherwise: {}", x.summary)
    } else {
        pause
    };
    if wanted {
        x.outcome = Outcome::Held;
    }
    v.creates = 0;
    v.cancels.clear();
    v.drain = None;
    v.underused_since = underused_since;
    v
}
