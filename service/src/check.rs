//! The simple value checks every configuration section uses: each returns
//! an [`Invalid`] naming the key, so that `check-config` says which key to
//! fix and why.

use std::path::Path;
use std::time::Duration;

use crate::config::Invalid;

fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// `d` must lie in `min..=max`.
pub fn within(key: &str, d: Duration, min: Duration, max: Duration) -> Result<(), Invalid> {
    if d < min || d > max {
        return Err(Invalid::new(
            key,
            format!("{} is outside {}..={}", human(d), human(min), human(max)),
        ));
    }
    Ok(())
}

/// `d` must be at least `min`.
pub fn at_least(key: &str, d: Duration, min: Duration) -> Result<(), Invalid> {
    if d < min {
        return Err(Invalid::new(
            key,
            format!("{} is shorter than the minimum {}", human(d), human(min)),
        ));
    }
    Ok(())
}

/// `d` must not be zero.
pub fn positive(key: &str, d: Duration) -> Result<(), Invalid> {
    if d.is_zero() {
        return Err(Invalid::new(key, "must be greater than zero"));
    }
    Ok(())
}

/// `s` must hold something besides white space.
pub fn nonempty(key: &str, s: &str) -> Result<(), Invalid> {
    if s.trim().is_empty() {
        return Err(Invalid::new(key, "must not be empty"));
    }
    Ok(())
}

/// `p` must name something (a file or a directory).
pub fn names_a_path(key: &str, p: &Path, what: &str) -> Result<(), Invalid> {
    if p.as_os_str().is_empty() {
        return Err(Invalid::new(key, format!("must name a {what}")));
    }
    Ok(())
}

/// `p` must be an absolute path.
pub fn absolute(key: &str, p: &Path) -> Result<(), Invalid> {
    if p.as_os_str().is_empty() {
        return Err(Invalid::new(key, "must not be empty"));
    }
    if !p.is_absolute() {
        return Err(Invalid::new(
            key,
            format!("{} is not an absolute path", p.display()),
        ));
    }
    Ok(())
}

/// `s` must be an `http://` or `https://` URL with a host.
pub fn http_url(key: &str, s: &str) -> Result<(), Invalid> {
    let u =
        url::Url::parse(s).map_err(|e| Invalid::new(key, format!("{s:?} is not a URL: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none_or(str::is_empty) {
        return Err(Invalid::new(
            key,
            format!("{s:?} must be an http(s) URL with a host"),
        ));
    }
    Ok(())
}

/// Like [`http_url`], for an optional value (absent is fine).
pub fn optional_http_url(key: &str, s: Option<&str>) -> Result<(), Invalid> {
    s.map_or(Ok(()), |s| http_url(key, s))
}

/// `n` must lie in `min..=max`.
pub fn count_within<T>(key: &str, n: T, min: T, max: T) -> Result<(), Invalid>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if n < min || n > max {
        return Err(Invalid::new(key, format!("{n} is outside {min}..={max}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_names_its_key() {
        let s = Duration::from_secs(1);
        assert!(within("a.b", s, s, s).is_ok());
        let e = within("a.b", s * 2, s, s).unwrap_err();
        assert_eq!(e.key, "a.b");
        assert!(e.reason.contains("2s is outside 1s..=1s"), "{e}");
        assert!(
            at_least("k", s, s * 2)
                .unwrap_err()
                .reason
                .contains("minimum 2s")
        );
        assert!(positive("k", Duration::ZERO).is_err());
        assert!(nonempty("k", "  ").is_err());
        assert!(names_a_path("k", Path::new(""), "file").is_err());
        assert!(absolute("k", Path::new("rel")).is_err());
        assert!(absolute("k", Path::new("/abs")).is_ok());
        assert!(http_url("k", "https://h:1/x").is_ok());
        assert!(
            http_url("k", "ftp://h")
                .unwrap_err()
                .reason
                .contains("http(s)")
        );
        assert!(
            http_url("k", "nope")
                .unwrap_err()
                .reason
                .contains("not a URL")
        );
        assert!(optional_http_url("k", None).is_ok());
        assert!(
            count_within("k", 0u32, 1, 5)
                .unwrap_err()
                .reason
                .contains("0 is outside 1..=5")
        );
        assert_eq!(
            Invalid::new("x", "y").under("handlers.h").to_string(),
            "handlers.h.x: y"
        );
    }
}
