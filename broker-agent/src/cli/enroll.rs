//! `enroll-token`: mints an enrollment token offline, signed by the
//! operator's key (the key that signs operator requests), for the user data
//! of nodes a scale-up boots (`docs/security.md`, "Nodes created by a
//! scale-up").

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use gearshift_proto::enroll::mint_token;
use gearshift_proto::msg::{EnrollToken, MAX_USES, Validate};

use super::CliError;

/// Longest validity a token may be minted with: a token is a standing
/// permission to add hosts, so it should expire within days.
pub const MAX_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

/// What `gearshift-broker enroll-token` takes.
#[derive(clap::Args, Debug, Clone)]
pub struct TokenArgs {
    /// The district the enrolled nodes join.
    #[arg(long)]
    pub district: String,
    /// The profile (node size) the enrolled nodes join.
    #[arg(long)]
    pub profile: String,
    /// How long the token is accepted (at most 90 days).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How many distinct hosts it may enroll.
    #[arg(long, default_value_t = 1)]
    pub uses: u32,
    /// Restrict the token to this one host name.
    #[arg(long)]
    pub host: Option<String>,
    /// Key that signs the token: an operator key the broker agent trusts
    /// (operators.d), or the broker key itself (default: the
    /// configuration's signing key, else /etc/gearshift/operator.key).
    #[arg(long, env = "GEARSHIFT_OPERATOR_KEY")]
    pub key: Option<PathBuf>,
    /// Broker configuration file, for its signing key when --key is absent.
    #[arg(long, short = 'c', env = "GEARSHIFT_BROKER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Issuer name written in the token (shown in the broker's log).
    #[arg(long, default_value = "gearshift-operator")]
    pub from: String,
}

/// Mints the token `args` describe with the key at `key`.
pub fn mint(args: &TokenArgs, key: &std::path::Path) -> Result<String, CliError> {
    let grant = EnrollToken {
        district: args.district.clone(),
        profile: args.profile.clone(),
        max_uses: args.uses,
        host: args.host.clone(),
    };
    grant
        .validate()
        .map_err(|e| CliError::Usage(format!("{e} (--uses is 1..={MAX_USES})")))?;
    if args.ttl.is_zero() || args.ttl > MAX_TTL {
        return Err(CliError::Usage(
            "--ttl must be more than 0 and at most 90d".into(),
        ));
    }
    gearshift_proto::msg::check_name("--from", &args.from).map_err(CliError::Usage)?;
    let signer = gearshift_service::keys::load_keypair(key)?;
    let ttl = chrono::Duration::from_std(args.ttl).map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(mint_token(&signer, &args.from, grant, Utc::now(), ttl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_proto::Keyring;
    use gearshift_proto::msg::Role;

    fn args() -> TokenArgs {
        TokenArgs {
            district: "d1".into(),
            profile: "small".into(),
            ttl: Duration::from_secs(3600),
            uses: 2,
            host: None,
            key: None,
            config: None,
            from: "alice".into(),
        }
    }

    #[test]
    fn mints_a_token_the_operator_key_verifies_and_refuses_bad_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let (key, _, pair) =
            gearshift_service::keys::write_keypair(dir.path(), "operator", false).unwrap();
        let t = mint(&args(), &key).unwrap();
        let mut ring = Keyring::new();
        ring.add(pair.public(), Role::Operator, "op");
        let v = gearshift_proto::enroll::verify_token(&t, &ring, Utc::now()).unwrap();
        assert_eq!((v.grant.max_uses, v.issuer.as_str()), (2, "alice"));
        for bad in [
            TokenArgs { uses: 0, ..args() },
            TokenArgs {
                ttl: Duration::ZERO,
                ..args()
            },
            TokenArgs {
                ttl: MAX_TTL * 2,
                ..args()
            },
            TokenArgs {
                host: Some("a/b".into()),
                ..args()
            },
            TokenArgs {
                district: String::new(),
                ..args()
            },
        ] {
            assert!(
                matches!(mint(&bad, &key), Err(CliError::Usage(_))),
                "{bad:?}"
            );
        }
    }
}
