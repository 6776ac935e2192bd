//! The `heat` handler against real Heat: ResourceGroup and AutoScalingGroup.

use std::sync::Arc;
use std::time::Duration;

use gearshift_cloud::heat::post_alarm_url;
use gearshift_cloud::heat::scaling::{SignalTarget, signal_details};
use gearshift_cloud::heat::{Heat, StackId};
use gearshift_handlers::config::HeatConfig;
use gearshift_handlers::heat::HeatHandler;
use gearshift_handlers::{CreateRequest, GroupKey, Handler, NodeShape, RemoveRequest};
use serde_json::json;

use super::real::{self, Real, Stacks, added, members, names, removed, settle};

fn group() -> GroupKey {
    GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    }
}

fn create(op: &str) -> CreateRequest {
    CreateRequest {
        op: op.into(),
        group: group(),
        shape: NodeShape::default(),
        attempt: 1,
        epoch: 0,
    }
}

/// A removal naming the member's physical id as the node's cloud id (the
/// broker agent's record of the server; TestResource members have no Nova).
fn remove(op: &str, physical_id: &str) -> RemoveRequest {
    RemoveRequest {
        op: op.into(),
        group: group(),
        node: format!("{op}.example.com"),
        cloud_id: Some(physical_id.into()),
        attempt: 1,
        epoch: 0,
    }
}

fn handler(r: &Real, stack: &StackId, extra: &str) -> HeatHandler {
    let c: HeatConfig = toml::from_str(&format!(
        "stack = \"{stack}\"\npoll_interval = \"1s\"\nupdate_timeout = \"3m\"\nsignal_timeout = \"30s\"\n{extra}"
    ))
    .expect("heat config");
    c.validate().expect("valid");
    HeatHandler::with_session(c, r.session.clone())
}

async fn patch_and_wait(heat: &Heat, stack: &StackId, body: serde_json::Value) {
    let before = heat
        .get_stack(&stack.to_string())
        .await
        .unwrap()
        .updated_time;
    heat.patch_stack(stack, &body).await.unwrap();
    heat.wait_update(
        stack,
        before.as_deref(),
        real::STACK_WAIT,
        Duration::from_secs(1),
    )
    .await
    .unwrap();
}

pub async fn resource_group(r: Arc<Real>, stacks: Arc<Stacks>) {
    let heat = &r.heat;
    let top = stacks
        .create(
            "gs-conf-rg-",
            real::resource_group_template(),
            json!({"count": 2}),
        )
        .await
        .stack_id();
    let m0 = members(heat, &top, "group").await;
    assert_eq!(names(&m0), ["0", "1"]);

    // count + 1 with the operation id: the members update in place, one is added.
    let h = handler(&r, &top, "scale_up = \"count\"\nop_param = \"op\"\n");
    let out = h.create_node(&create("op-rg-1")).await.unwrap();
    let m1 = members(heat, &top, "group").await;
    assert_eq!(added(&m0, &m1), ["2"], "{}", out.detail);
    assert_eq!(
        &m1[..2],
        &m0[..],
        "existing members keep their physical ids"
    );

    // Where the operation id would replace members (user_data under REPLACE), it is refused.
    patch_and_wait(heat, &top, json!({"parameters": {"op_replaces": true}})).await;
    let m2 = members(heat, &top, "group").await;
    let e = h.create_node(&create("op-rg-2")).await.unwrap_err();
    assert_eq!(e.label(), "permanent", "{e}");
    assert!(e.to_string().contains("replace existing members"), "{e}");
    assert_eq!(members(heat, &top, "group").await, m2, "nothing changed");
    assert_eq!(
        heat.get_stack(&top.to_string())
            .await
            .unwrap()
            .int_param("count"),
        Some(3)
    );

    // removal_policies: exactly the middle member goes, names are not reused.
    let h = handler(&r, &top, "scale_up = \"count\"\n");
    h.remove_node(&remove("op-rg-3", &m2[1].1)).await.unwrap();
    let m3 = members(heat, &top, "group").await;
    assert_eq!(removed(&m2, &m3), ["1"]);
    assert_eq!(m3.len(), 2);

    // mark-unhealthy on a ResourceGroup: marked, then removed exactly (not replaced).
    let h = handler(&r, &top, "remove = \"mark-unhealthy\"\n");
    let out = h.remove_node(&remove("op-rg-4", &m3[0].1)).await.unwrap();
    assert!(out.gone, "{}", out.detail);
    assert_eq!(members(heat, &top, "group").await, m3[1..]);
}

fn target(stack: &StackId, group: &str, policy: &str) -> SignalTarget {
    SignalTarget {
        stack: stack.clone(),
        group: group.into(),
        policy: policy.into(),
    }
}

pub async fn autoscaling_group(r: Arc<Real>, stacks: Arc<Stacks>) {
    let (a, b) = tokio::join!(
        stacks.create("gs-conf-asg-", real::autoscaling_template(), json!({})),
        stacks.create(
            "gs-conf-asgd-",
            real::desired_capacity_template(),
            json!({})
        ),
    );
    let (a, b) = (a.stack_id(), b.stack_id());
    signals_and_removal(&r, &a).await;
    desired_capacity(&r, &b).await;
}

async fn signals_and_removal(r: &Real, a: &StackId) {
    let heat = &r.heat;
    let up = target(a, "asg", "scale_up");
    let m0 = settle(heat, &up, 1).await;

    // Signal through the policy (token): confirmed, exactly one member added.
    let h = handler(
        r,
        a,
        "group_resource = \"asg\"\nremove = \"mark-unhealthy\"\n",
    );
    let out = h.create_node(&create("op-asg-1")).await.unwrap();
    let m1 = settle(heat, &up, 2).await;
    assert_eq!(added(&m0, &m1).len(), 1, "{}", out.detail);
    let events = heat.signal_events(a, "scale_up", 1).await.unwrap();
    assert!(
        events[0]
            .resource_status_reason
            .as_deref()
            .unwrap_or("")
            .starts_with("alarm state changed from ok to alarm"),
        "an Aodh-shaped body gives a readable event: {events:?}"
    );

    // Push mode's pre-signed alarm URL: the same, without a token on the URL.
    let url = real::output(heat, a, "scale_up_url").await;
    let h_url = handler(
        r,
        a,
        &format!("group_resource = \"asg\"\nscale_up_alarm_url = \"{url}\"\n"),
    );
    h_url.create_node(&create("op-asg-2")).await.unwrap();
    let m2 = settle(heat, &up, 3).await;
    assert_eq!(added(&m1, &m2).len(), 1);

    // mark-unhealthy removes exactly the middle member (a scale-down signal would take two).
    h.remove_node(&remove("op-asg-3", &m2[1].1)).await.unwrap();
    let m3 = settle(heat, &up, 2).await;
    assert_eq!(removed(&m2, &m3), [m2[1].0.clone()]);

    // A tampered alarm URL: heat-api-cfn's XML AccessDenied, typed.
    let e = post_alarm_url(
        r.session.http(),
        &url.replace("Signature=", "Signature=x"),
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            gearshift_cloud::CloudError::PresignedRefused { status: 403, .. }
        ),
        "{e}"
    );

    cooldown(r, a, &m3).await;
}

/// A scale-up through the 600 s cooldown policy starts the group's
/// cooldown; the next signal is refused before sending (busy), and a signal
/// sent anyway is answered 200, ignored by Heat, and reported as such.
async fn cooldown(r: &Real, a: &StackId, m3: &[(String, String)]) {
    let heat = &r.heat;
    let slow = handler(
        r,
        a,
        "group_resource = \"asg\"\nscale_up_policy = \"scale_up_slow\"\n",
    );
    slow.create_node(&create("op-asg-4")).await.unwrap();
    let up = target(a, "asg", "scale_up");
    let m4 = settle(heat, &up, 3).await;
    assert_eq!(added(m3, &m4).len(), 1);
    let h = handler(r, a, "group_resource = \"asg\"\n");
    let e = h.create_node(&create("op-asg-5")).await.unwrap_err();
    assert_eq!(e.label(), "busy", "{e}");
    assert!(e.to_string().contains("cooldown"), "{e}");

    // Sent regardless (as an old client would): 200, nothing happens, typed.
    let nested = heat.group_stack(a, "asg").await.unwrap();
    let mut before = heat.group_state(&up, &nested).await.unwrap();
    let prepared_blind = {
        before.cooldown_end = None; // pretend the cooldown was not seen
        let tpl_json = heat.get_template(a).await.unwrap();
        let params = heat.get_stack(&a.to_string()).await.unwrap().parameters;
        let tpl = gearshift_cloud::heat::template::Template::new(&tpl_json, &params);
        gearshift_cloud::heat::scaling::Prepared {
            group: tpl.group("asg").unwrap(),
            policy: tpl.policy("scale_up").unwrap(),
            nested,
            before,
        }
    };
    heat.signal_resource(a, "scale_up", Some(&signal_details("conformance: ignored")))
        .await
        .expect("Heat answers 200 to a signal it will ignore");
    let e = heat
        .confirm_signal(
            &up,
            &prepared_blind,
            Duration::from_secs(15),
            None,
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            gearshift_cloud::CloudError::SignalIgnored {
                why: gearshift_cloud::error::Ignored::Cooldown { .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(members(heat, a, "asg").await, m4, "Heat did nothing");
}

/// `desired_capacity` from a parameter: the removal lowers it. A literal
/// one is refused. At `max_size` a scale-up is refused before signalling.
async fn desired_capacity(r: &Real, b: &StackId) {
    let heat = &r.heat;
    let up_d = target(b, "asg_d", "up_d");
    let d0 = settle(heat, &up_d, 3).await;
    let h = handler(
        r,
        b,
        "group_resource = \"asg_d\"\nscale_up_policy = \"up_d\"\nremove = \"mark-unhealthy\"\n",
    );
    h.remove_node(&remove("op-d-1", &d0[1].1)).await.unwrap();
    let d1 = members(heat, b, "asg_d").await;
    assert_eq!(removed(&d0, &d1), [d0[1].0.clone()]);
    assert_eq!(d1.len(), 2);
    assert_eq!(
        heat.get_stack(&b.to_string())
            .await
            .unwrap()
            .int_param("desired"),
        Some(2)
    );

    // A literal desired_capacity: refused, nothing marked or removed.
    let lit = members(heat, b, "asg_lit").await;
    let h_lit = handler(
        r,
        b,
        "group_resource = \"asg_lit\"\nremove = \"mark-unhealthy\"\n",
    );
    let e = h_lit
        .remove_node(&remove("op-d-2", &lit[0].1))
        .await
        .unwrap_err();
    assert_eq!(e.label(), "permanent", "{e}");
    assert!(e.to_string().contains("desired_capacity is fixed"), "{e}");
    let nested = heat.group_stack(b, "asg_lit").await.unwrap();
    assert!(
        heat.members(&nested)
            .await
            .unwrap()
            .iter()
            .all(|m| !m.is_failed())
    );

    // At max_size: refused as quota before any signal.
    patch_and_wait(heat, b, json!({"parameters": {"asg_max": 2}})).await;
    let e = h.create_node(&create("op-d-3")).await.unwrap_err();
    assert!(e.is_quota(), "{e}");
    assert!(e.to_string().contains("max_size 2"), "{e}");
    assert!(
        heat.signal_events(b, "up_d", 1).await.unwrap().is_empty(),
        "no signal was sent"
    );
    assert_eq!(members(heat, b, "asg_d").await, d1);
}
