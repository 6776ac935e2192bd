//! AWS Signature Version 4, implemented here (HMAC-SHA256 over a canonical
//! request), without I/O: give it a request's parts and a time, get the
//! `Authorization` header back.
//!
//! We sign only what we send: a `POST` of a form body to a query API
//! (CloudWatch `PutMetricData`) and the `GET`s a test uses to read data
//! back. The canonical forms follow the published specification and are
//! checked against AWS's own signature test suite in the unit tests.
//!
//! Path segments are percent-encoded once from their raw form (what the
//! test suite expects for non-S3 services whose paths hold only unreserved
//! characters, like CloudWatch's `/` and Heat's `/v1`).

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

use crate::credentials::AwsCredentials;

type HmacSha256 = Hmac<Sha256>;

/// The algorithm name in the string to sign and the header.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Characters SigV4 leaves unencoded: `A-Z a-z 0-9 - _ . ~` (RFC 3986 unreserved).
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes `s` the way SigV4 and the AWS query protocol want:
/// everything but RFC 3986 unreserved characters, as `%XX` in upper case.
pub fn uri_encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// `x-amz-date` format: `20150830T123600Z`.
pub fn amz_date(t: DateTime<Utc>) -> String {
    t.format("%Y%m%dT%H%M%SZ").to_string()
}

/// The parts of a request that the signature covers.
#[derive(Debug, Clone)]
pub struct SignableRequest<'a> {
    /// HTTP method, upper case.
    pub method: &'a str,
    /// The raw (not yet encoded) path, starting with `/`.
    pub path: &'a str,
    /// Query parameters, raw (not yet encoded), in any order.
    pub query: &'a [(String, String)],
    /// Headers to sign, in any order and case. Must include `host` and
    /// `x-amz-date` (the caller adds them to the real request too).
    pub headers: &'a [(String, String)],
    /// The body as sent.
    pub body: &'a [u8],
}

/// Where and as what a signature is made.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    /// Region, for example `us-east-1` (Heat accepted any).
    pub region: &'a str,
    /// Signing name of the service: `monitoring` for CloudWatch.
    pub service: &'a str,
    /// The request time (the same as the `x-amz-date` header).
    pub time: DateTime<Utc>,
}

/// A computed signature with its intermediate forms (kept for debugging and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The canonical request.
    pub canonical_request: String,
    /// The string to sign.
    pub string_to_sign: String,
    /// Lower-case hex signature.
    pub signature: String,
    /// `host;x-amz-date`-style list of signed header names.
    pub signed_headers: String,
    /// The `Authorization` header value.
    pub authorization: String,
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac =
        <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The canonical URI: each segment of the raw path percent-encoded.
fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    path.split('/')
        .map(uri_encode)
        .collect::<Vec<_>>()
        .join("/")
}

/// The canonical query string: encoded pairs sorted by key, then value.
pub fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Trims a header value and collapses inner runs of spaces to one.
fn normalize_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Canonical headers (with the trailing newline) and the signed-header list.
fn canonical_headers(headers: &[(String, String)]) -> (String, String) {
    let mut merged: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (k, v) in headers {
        merged
            .entry(k.trim().to_ascii_lowercase())
            .or_default()
            .push(normalize_value(v));
    }
    let canon: String = merged
        .iter()
        .map(|(k, vs)| format!("{k}:{}\n", vs.join(",")))
        .collect();
    let signed = merged.keys().cloned().collect::<Vec<_>>().join(";");
    (canon, signed)
}

/// Signs `req` with `creds` in `scope`.
pub fn sign(creds: &AwsCredentials, scope: &Scope<'_>, req: &SignableRequest<'_>) -> Signed {
    let (canon_headers, signed_headers) = canonical_headers(req.headers);
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        canonical_uri(req.path),
        canonical_query(req.query),
        canon_headers,
        signed_headers,
        sha256_hex(req.body)
    );
    let date = scope.time.format("%Y%m%d").to_string();
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{}\n{credential_scope}\n{}",
        amz_date(scope.time),
        sha256_hex(canonical_request.as_bytes())
    );
    let k_secret = format!("AWS4{}", creds.secret_access_key.expose());
    let k_date = hmac(k_secret.as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, scope.region.as_bytes());
    let k_service = hmac(&k_region, scope.service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex::encode(hmac(&k_signing, string_to_sign.as_bytes()));
    let authorization = format!(
        "{ALGORITHM} Credential={}/{credential_scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key_id
    );
    Signed {
        canonical_request,
        string_to_sign,
        signature,
        signed_headers,
        authorization,
    }
}

#[cfg(test)]
mod tests {
    //! Vectors from AWS's published "Signature Version 4 test suite"
    //! (aws-sig-v4-test-suite, 2015-08-30): access key `AKIDEXAMPLE`, secret
    //! `wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY`, region `us-east-1`,
    //! service `service`, time `20150830T123600Z`, host `example.amazonaws.com`.
    use super::*;
    use crate::credentials::SecretString;
    use chrono::TimeZone;

    fn suite_creds() -> AwsCredentials {
        AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: SecretString::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        }
    }

    fn suite_scope() -> Scope<'static> {
        Scope {
            region: "us-east-1",
            service: "service",
            time: Utc.with_ymd_and_hms(2015, 8, 30, 12, 36, 0).unwrap(),
        }
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn run(
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Signed {
        let mut headers = h(&[
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ]);
        headers.extend(h(extra));
        let query = h(query);
        sign(
            &suite_creds(),
            &suite_scope(),
            &SignableRequest {
                method,
                path,
                query: &query,
                headers: &headers,
                body,
            },
        )
    }

    fn auth(signed_headers: &str, sig: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders={signed_headers}, Signature={sig}"
        )
    }

    #[test]
    fn get_vanilla() {
        let s = run("GET", "/", &[], &[], b"");
        assert_eq!(
            s.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\nbb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        assert_eq!(
            s.authorization,
            auth(
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
    }

    #[test]
    fn get_query_order_key_case_and_unreserved() {
        let s = run(
            "GET",
            "/",
            &[("Param2", "value2"), ("Param1", "value1")],
            &[],
            b"",
        );
        assert_eq!(
            s.signature,
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
        let unreserved = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let s = run("GET", "/", &[(unreserved, unreserved)], &[], b"");
        assert_eq!(
            s.signature,
            "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"
        );
        let s = run("GET", "/", &[("ሴ", "bar")], &[], b"");
        assert_eq!(
            s.signature,
            "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"
        );
    }

    #[test]
    fn get_paths() {
        let s = run(
            "GET",
            "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            &[],
            &[],
            b"",
        );
        assert_eq!(
            s.signature,
            "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"
        );
        let s = run("GET", "/ሴ", &[], &[], b"");
        assert_eq!(
            s.signature,
            "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"
        );
    }

    #[test]
    fn header_rules() {
        // get-header-value-trim: values trimmed, inner spaces collapsed.
        let s = run(
            "GET",
            "/",
            &[],
            &[("My-Header1", " value1"), ("My-Header2", "\"a   b   c\"")],
            b"",
        );
        assert_eq!(
            s.authorization,
            auth(
                "host;my-header1;my-header2;x-amz-date",
                "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"
            )
        );
        // post-header-key-sort and post-header-value-case.
        let s = run("POST", "/", &[], &[("My-Header1", "value1")], b"");
        assert_eq!(
            s.signature,
            "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c"
        );
        let s = run("POST", "/", &[], &[("My-Header1", "VALUE1")], b"");
        assert_eq!(
            s.signature,
            "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"
        );
    }

    #[test]
    fn post_vanilla_and_query() {
        let s = run("POST", "/", &[], &[], b"");
        assert_eq!(
            s.signature,
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        );
        let s = run("POST", "/", &[("Param1", "value1")], &[], b"");
        assert_eq!(
            s.signature,
            "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"
        );
    }

    #[test]
    fn post_form_body() {
        // post-x-www-form-urlencoded: the shape of every PutMetricData call.
        let s = run(
            "POST",
            "/",
            &[],
            &[("Content-Type", "application/x-www-form-urlencoded")],
            b"Param1=value1",
        );
        assert_eq!(
            s.canonical_request,
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
        );
        assert_eq!(
            s.authorization,
            auth(
                "content-type;host;x-amz-date",
                "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
            )
        );
        let s = run(
            "POST",
            "/",
            &[],
            &[(
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf8",
            )],
            b"Param1=value1",
        );
        assert_eq!(
            s.signature,
            "1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe"
        );
    }

    #[test]
    fn a_different_secret_changes_the_signature() {
        let good = run("POST", "/", &[], &[], b"x");
        let mut creds = suite_creds();
        creds.secret_access_key = SecretString::new("not-the-secret");
        let headers = h(&[
            ("Host", "example.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ]);
        let bad = sign(
            &creds,
            &suite_scope(),
            &SignableRequest {
                method: "POST",
                path: "/",
                query: &[],
                headers: &headers,
                body: b"x",
            },
        );
        assert_ne!(good.signature, bad.signature);
        assert_eq!(good.canonical_request, bad.canonical_request);
    }

    #[test]
    fn encoding() {
        assert_eq!(uri_encode("system/linux"), "system%2Flinux");
        assert_eq!(uri_encode("a b+c~"), "a%20b%2Bc~");
        assert_eq!(uri_encode("é"), "%C3%A9");
    }
}
