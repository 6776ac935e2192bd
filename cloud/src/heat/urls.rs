//! What a signal URL names: the stack and the resource (a scaling policy)
//! it signals, so that the signal can be confirmed by watching the group.
//!
//! Shapes, as Heat 27 makes them (`docs/openstack-conformance.md`, point 5):
//! - pre-signed `alarm_url` (heat-api-cfn):
//!   `http://h:8000/v1/signal/arn%3Aopenstack%3Aheat%3A%3A<project>%3Astacks/<name>/<id>/resources/<policy>?SignatureMethod=HmacSHA256&SignatureVersion=2&AWSAccessKeyId=...&Signature=...`
//!   (colons encoded, slashes literal, no `Timestamp`: it never expires);
//! - `signal_url` (native, needs a token):
//!   `http://h:8004/v1/<project>/stacks/<name>/<id>/resources/<policy>/signal`.

use super::StackId;

/// The stack and resource a signal URL (either shape) names.
pub fn signal_url_target(url: &str) -> Option<(StackId, String)> {
    let parsed = url::Url::parse(url).ok()?;
    let path = percent_encoding::percent_decode_str(parsed.path())
        .decode_utf8()
        .ok()?
        .into_owned();
    let tail = match path.split_once(":stacks/") {
        Some((_, t)) => t.to_string(),
        None => path.split_once("/stacks/")?.1.to_string(),
    };
    let parts: Vec<&str> = tail.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        [name, id, "resources", res] | [name, id, "resources", res, "signal"]
            if !name.is_empty() && !id.is_empty() && !res.is_empty() =>
        {
            Some((
                StackId {
                    name: name.to_string(),
                    id: id.to_string(),
                },
                res.to_string(),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_alarm_and_signal_urls() {
        // heat-api-cfn 27, scenario `alarm` (signature shortened).
        let alarm = "http://127.0.0.1:8000/v1/signal/arn%3Aopenstack%3Aheat%3A%3A6ff48038%3Astacks/gs-alarm-b7eb19/1c1834db-fe5e/resources/scale_up?SignatureMethod=HmacSHA256&SignatureVersion=2&AWSAccessKeyId=95b6&Signature=XOm%3D";
        let (s, r) = signal_url_target(alarm).unwrap();
        assert_eq!(
            (s.to_string().as_str(), r.as_str()),
            ("gs-alarm-b7eb19/1c1834db-fe5e", "scale_up")
        );
        let native =
            "http://127.0.0.1:8004/v1/6ff48038/stacks/gs-x/ae5f/resources/scale_down/signal";
        let (s, r) = signal_url_target(native).unwrap();
        assert_eq!(
            (s.to_string().as_str(), r.as_str()),
            ("gs-x/ae5f", "scale_down")
        );
        // An older client's fully encoded ARN.
        let encoded = "http://h/v1/signal/arn%3Aopenstack%3Aheat%3A%3At%3Astacks%2Fs%2Fi%2Fresources%2Fp?Signature=x";
        assert_eq!(signal_url_target(encoded).unwrap().1, "p");
        assert_eq!(signal_url_target("http://h/v1/other"), None);
        assert_eq!(signal_url_target("not a url"), None);
    }
}
