//! The built-in strategies: the seed's examples and the default.
//!
//! Each receives the candidates left after the filters (never empty) and
//! returns the index of its choice, or a refusal.

use std::collections::HashSet;

use gearshift_proto::msg::NodeProperties;
use rand::Rng;

use crate::config::PlacementConfig;
use crate::engine::Inputs;

/// What a strategy decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The candidate at this index.
    Node(usize),
    /// No node: the reason.
    Refuse(String),
}

/// The seed's error when `php_hosts` matches no candidate.
pub const PHP_HOSTS_NO_MATCH: &str =
    "The gear-placement PHP_HOSTS setting doesn't match any of the NodeProfile names";
/// The seed's error when `slow_hosts` matches no candidate.
pub const SLOW_HOSTS_NO_MATCH: &str =
    "The gear-placement SLOW_HOSTS setting does not match any available NodeProfile names";

fn load(n: &NodeProperties) -> f64 {
    let c = n.node_consumed_capacity;
    if c.is_finite() {
        c.clamp(0.0, 100.0)
    } else {
        100.0
    }
}

/// `default` (the standard algorithm the seed's examples fall back to):
/// keep districted nodes if any, then zoned nodes if any, drop nodes above
/// the average consumed capacity, and choose at random among the rest with
/// weights `101 - consumed %` (emptier nodes are likelier).
pub fn default_choice<R: Rng + ?Sized>(cands: &[&NodeProperties], rng: &mut R) -> usize {
    let mut idx: Vec<usize> = (0..cands.len()).collect();
    let districted: Vec<usize> = idx
        .iter()
        .copied()
        .filter(|&i| cands[i].district_id.is_some())
        .collect();
    if !districted.is_empty() {
        idx = districted;
    }
    let zoned: Vec<usize> = idx
        .iter()
        .copied()
        .filter(|&i| cands[i].zone_id.is_some())
        .collect();
    if !zoned.is_empty() {
        idx = zoned;
    }
    if idx.is_empty() {
        return 0;
    }
    let avg = idx.iter().map(|&i| load(cands[i])).sum::<f64>() / idx.len() as f64;
    // The least loaded node is never above the average, so `idx` stays non-empty.
    idx.retain(|&i| load(cands[i]) <= avg + 1e-9);
    let total: f64 = idx.iter().map(|&i| 101.0 - load(cands[i])).sum();
    let mut x = rng.random::<f64>() * total;
    for &i in &idx {
        let w = 101.0 - load(cands[i]);
        if x < w {
            return i;
        }
        x -= w;
    }
    idx.last().copied().unwrap_or(0)
}

/// `least-consumed` (the seed's "round robin"): the lowest
/// `node_consumed_capacity`; the first such candidate on ties.
pub fn least_consumed(cands: &[&NodeProperties]) -> usize {
    let mut best = 0;
    for (i, n) in cands.iter().enumerate() {
        if n.node_consumed_capacity
            .total_cmp(&cands[best].node_consumed_capacity)
            == std::cmp::Ordering::Less
        {
            best = i;
        }
    }
    best
}

/// `most-free-memory`: the most `mem_free_mb` (unknown counts as 0, like the
/// seed's `Hash.new(0)`); the first such candidate on ties.
pub fn most_free_memory(cands: &[&NodeProperties]) -> usize {
    let mut best = 0;
    for (i, n) in cands.iter().enumerate() {
        if n.mem_free_mb.unwrap_or(0) > cands[best].mem_free_mb.unwrap_or(0) {
            best = i;
        }
    }
    best
}

/// `first`: the first candidate.
pub fn first(_cands: &[&NodeProperties]) -> usize {
    0
}

/// `php-hosts`: a PHP application (its web cartridge is one of
/// `php_cartridges`) goes to a random candidate among `php_hosts`, and is
/// refused with the seed's error when none is a candidate; other
/// applications are placed by `default`.
pub fn php_hosts<R: Rng + ?Sized>(
    cfg: &PlacementConfig,
    inp: &Inputs<'_>,
    cands: &[&NodeProperties],
    rng: &mut R,
) -> Choice {
    let is_php = inp
        .app
        .web_cartridge
        .as_deref()
        .is_some_and(|c| cfg.php_cartridges.iter().any(|p| p == c));
    if !is_php {
        tracing::debug!(
            cartridge = ?inp.app.web_cartridge,
            "not a PHP app; selecting a node normally"
        );
        return Choice::Node(default_choice(cands, rng));
    }
    let hosts: HashSet<&str> = cfg.php_hosts.iter().map(String::as_str).collect();
    let matched: Vec<usize> = (0..cands.len())
        .filter(|&i| hosts.contains(cands[i].name.as_str()))
        .collect();
    if matched.is_empty() {
        return Choice::Refuse(PHP_HOSTS_NO_MATCH.into());
    }
    Choice::Node(matched[rng.random_range(0..matched.len())])
}

/// `pinned-user`: the gears of `pinned_user` go to the first candidate among
/// `slow_hosts`, refused with the seed's error when none is a candidate;
/// other users' gears are placed by `default`.
pub fn pinned_user<R: Rng + ?Sized>(
    cfg: &PlacementConfig,
    inp: &Inputs<'_>,
    cands: &[&NodeProperties],
    rng: &mut R,
) -> Choice {
    if cfg.pinned_user.as_deref() != Some(inp.user.login.as_str()) {
        tracing::debug!(user = %inp.user.login, "user is not pinned; choosing a node normally");
        return Choice::Node(default_choice(cands, rng));
    }
    let slow: HashSet<&str> = cfg.slow_hosts.iter().map(String::as_str).collect();
    match (0..cands.len()).find(|&i| slow.contains(cands[i].name.as_str())) {
        Some(i) => Choice::Node(i),
        None => Choice::Refuse(SLOW_HOSTS_NO_MATCH.into()),
    }
}

/// `vendor-blacklist`: refuses a gear with a component whose cartridge
/// vendor is `blacklisted_vendor`; other gears are placed by `default`.
pub fn vendor_blacklist<R: Rng + ?Sized>(
    cfg: &PlacementConfig,
    inp: &Inputs<'_>,
    cands: &[&NodeProperties],
    rng: &mut R,
) -> Choice {
    if let Some(v) = &cfg.blacklisted_vendor
        && inp.components.iter().any(|c| c.cartridge_vendor == *v)
    {
        return Choice::Refuse(format!(
            "Applications containing cartridges from {v} are blacklisted"
        ));
    }
    Choice::Node(default_choice(cands, rng))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn n(name: &str, load: f64) -> NodeProperties {
        NodeProperties {
            name: name.into(),
            node_consumed_capacity: load,
            district_id: Some("d".into()),
            district_available_capacity: None,
            region_id: None,
            zone_id: None,
            profile: None,
            active: true,
            mem_free_mb: None,
            gears_active: None,
            max_active_gears: None,
        }
    }

    #[test]
    fn default_drops_above_average_and_prefers_districted_and_zoned() {
        let nodes = [n("busy", 90.0), n("light", 10.0), n("mid", 40.0)];
        let refs: Vec<&NodeProperties> = nodes.iter().collect();
        // Average is 46.7: "busy" is never chosen; both others are, over many draws.
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = [0usize; 3];
        for _ in 0..2000 {
            seen[default_choice(&refs, &mut rng)] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1] > seen[2] && seen[2] > 0, "{seen:?}");

        let mut undistricted = n("undistricted", 0.0);
        undistricted.district_id = None;
        let mut zoned = n("zoned", 80.0);
        zoned.zone_id = Some("z".into());
        let nodes = [undistricted, n("unzoned", 0.0), zoned];
        let refs: Vec<&NodeProperties> = nodes.iter().collect();
        for _ in 0..100 {
            assert_eq!(default_choice(&refs, &mut rng), 2);
        }
    }

    #[test]
    fn default_is_reproducible_with_a_seed() {
        let nodes: Vec<NodeProperties> = (0..50)
            .map(|i| n(&format!("n{i}"), (i % 7) as f64))
            .collect();
        let refs: Vec<&NodeProperties> = nodes.iter().collect();
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..20)
                .map(|_| default_choice(&refs, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn least_consumed_and_most_free_memory_take_the_first_best() {
        let mut a = n("a", 30.0);
        a.mem_free_mb = Some(100);
        let mut b = n("b", 20.0);
        b.mem_free_mb = Some(900);
        let mut c = n("c", 20.0);
        c.mem_free_mb = Some(900);
        let d = n("d", 50.0);
        let nodes = [a, b, c, d];
        let refs: Vec<&NodeProperties> = nodes.iter().collect();
        assert_eq!(least_consumed(&refs), 1);
        assert_eq!(most_free_memory(&refs), 1);
        assert_eq!(first(&refs), 0);
    }
}
