//! The `email` handler: one readable message per event to an operator,
//! over SMTP (lettre), with optional STARTTLS or TLS and AUTH.
//!
//! The seeds suggested it ("email a system administrator when resources
//! are needed"): the operator adds or removes the host by hand. The message
//! says what is asked, for which district and profile, the node group's
//! cloud shape, and the operation id the new node should report (so the
//! broker agent sees the request fulfilled).
//!
//! SMTP failures map by lettre's classification: a permanent (5xx) answer
//! or a client-side error is `Permanent`; transient (4xx), timeouts and
//! connection failures are `Transient`.

use std::time::Duration;

use async_trait::async_trait;
use lettre::message::{Mailbox, header::ContentType};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::{EmailConfig, SmtpSecurity};
use crate::{
    BuildError, CreateOutcome, CreateRequest, Handler, HandlerContext, HandlerError, RemoveOutcome,
    RemoveRequest,
};

/// Sends one email per event.
pub struct EmailHandler {
    cfg: EmailConfig,
    agent: String,
    from: Mailbox,
    to: Vec<Mailbox>,
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

impl std::fmt::Debug for EmailHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailHandler")
            .field("smtp_host", &self.cfg.smtp_host)
            .field("smtp_port", &self.cfg.smtp_port)
            .field("to", &self.cfg.to)
            .finish_non_exhaustive()
    }
}

impl EmailHandler {
    /// Builds the SMTP transport (reads the password and CA files; no connection yet).
    pub fn new(cfg: EmailConfig, ctx: &HandlerContext) -> Result<Self, BuildError> {
        cfg.validate()?;
        let from: Mailbox = cfg
            .from
            .parse()
            .map_err(|e| BuildError::Setup(format!("from: {e}")))?;
        let to = cfg
            .to
            .iter()
            .map(|t| t.parse::<Mailbox>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| BuildError::Setup(format!("to: {e}")))?;
        let tls_params = || -> Result<TlsParameters, BuildError> {
            let mut b = TlsParameters::builder(cfg.smtp_host.clone());
            if let Some(ca) = &cfg.ca_file {
                let pem = std::fs::read(ca)
                    .map_err(|e| BuildError::Setup(format!("ca_file {}: {e}", ca.display())))?;
                let cert = Certificate::from_pem(&pem)
                    .map_err(|e| BuildError::Setup(format!("ca_file {}: {e}", ca.display())))?;
                b = b.add_root_certificate(cert);
            }
            b.build()
                .map_err(|e| BuildError::Setup(format!("TLS settings for {}: {e}", cfg.smtp_host)))
        };
        let tls = match cfg.security {
            SmtpSecurity::None => Tls::None,
            SmtpSecurity::Starttls => Tls::Required(tls_params()?),
            SmtpSecurity::Tls => Tls::Wrapper(tls_params()?),
        };
        let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(cfg.smtp_host.clone())
            .port(cfg.smtp_port)
            .tls(tls)
            .timeout(Some(cfg.timeout));
        if let (Some(user), Some(pw_file)) = (&cfg.username, &cfg.password_file) {
            let pw = std::fs::read_to_string(pw_file).map_err(|e| {
                BuildError::Setup(format!("password_file {}: {e}", pw_file.display()))
            })?;
            let pw = pw.lines().next().unwrap_or("").to_string();
            if pw.is_empty() {
                return Err(BuildError::Setup(format!(
                    "password_file {} is empty",
                    pw_file.display()
                )));
            }
            b = b.credentials(Credentials::new(user.clone(), pw));
        }
        Ok(EmailHandler {
            transport: b.build(),
            agent: ctx.agent.clone(),
            from,
            to,
            cfg,
        })
    }

    async fn send(&self, subject: String, body: String) -> Result<(), HandlerError> {
        let mut m = Message::builder()
            .from(self.from.clone())
            .subject(
                format!("{} {subject}", self.cfg.subject_prefix)
                    .trim()
                    .to_string(),
            )
            .header(ContentType::TEXT_PLAIN);
        for t in &self.to {
            m = m.to(t.clone());
        }
        let msg = m
            .body(body)
            .map_err(|e| HandlerError::Permanent(format!("cannot build the message: {e}")))?;
        let outer = self.cfg.timeout + Duration::from_secs(5);
        match tokio::time::timeout(outer, self.transport.send(msg)).await {
            Err(_) => Err(HandlerError::Transient(format!(
                "SMTP {}:{} did not finish within {:?}",
                self.cfg.smtp_host, self.cfg.smtp_port, outer
            ))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                let msg = format!("SMTP {}:{}: {e}", self.cfg.smtp_host, self.cfg.smtp_port);
                if e.is_permanent() || e.is_client() {
                    Err(HandlerError::Permanent(msg))
                } else {
                    Err(HandlerError::Transient(msg))
                }
            }
        }
    }
}

/// Subject and body for a create request.
pub fn create_message(req: &CreateRequest, agent: &str) -> (String, String) {
    let s = &req.shape;
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(not set)".into());
    let subject = format!(
        "create-node: one more {} node for district {} (op {})",
        req.group.profile, req.group.district, req.op
    );
    let body = format!(
        "gearshift's broker agent \"{agent}\" asks for one new node host.\n\
         \n\
         Event:      create-node --profile={profile} --district={district}\n\
         Operation:  {op} (attempt {attempt})\n\
         \n\
         Node group shape:\n\
         \x20 flavor:             {flavor}\n\
         \x20 image:              {image}\n\
         \x20 availability zone:  {az}\n\
         \x20 volume:             {volume}\n\
         \x20 key pair:           {key}\n\
         \x20 networks:           {nets}\n\
         \x20 security groups:    {sgs}\n\
         \n\
         What to do: boot a node host of profile {profile}, add it to district\n\
         {district}, and start its gearshift node agent with the boot operation\n\
         id {op} (booted_for), so that the broker agent sees this request fulfilled.\n\
         If the infrastructure cannot provide it, nothing needs to be done: the\n\
         broker agent will time the request out and report it.\n",
        profile = req.group.profile,
        district = req.group.district,
        op = req.op,
        attempt = req.attempt,
        flavor = opt(&s.flavor),
        image = opt(&s.image),
        az = opt(&s.availability_zone),
        volume = s
            .volume_gb
            .map(|g| format!("{g} GiB"))
            .unwrap_or_else(|| "(none)".into()),
        key = opt(&s.key_name),
        nets = if s.networks.is_empty() {
            "(default)".into()
        } else {
            s.networks.join(", ")
        },
        sgs = if s.security_groups.is_empty() {
            "(default)".into()
        } else {
            s.security_groups.join(", ")
        },
    );
    (subject, body)
}

/// Subject and body for a remove request.
pub fn remove_message(req: &RemoveRequest, agent: &str) -> (String, String) {
    let subject = format!(
        "remove-node: {} (district {}, op {})",
        req.node, req.group.district, req.op
    );
    let body = format!(
        "gearshift's broker agent \"{agent}\" has emptied node host {node} and asks\n\
         for it to be removed.\n\
         \n\
         Event:      remove-node --host={node} --district={district}\n\
         Profile:    {profile}\n\
         Cloud id:   {cloud}\n\
         Operation:  {op} (attempt {attempt})\n\
         \n\
         The node is inactive and holds no gears. Remove it from its district\n\
         (oo-admin-ctl-district -c remove-node) and delete the host.\n",
        node = req.node,
        district = req.group.district,
        profile = req.group.profile,
        cloud = req.cloud_id.as_deref().unwrap_or("(unknown)"),
        op = req.op,
        attempt = req.attempt,
    );
    (subject, body)
}

#[async_trait]
impl Handler for EmailHandler {
    fn kind(&self) -> &'static str {
        "email"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let (subject, body) = create_message(req, &self.agent);
        self.send(subject, body).await?;
        Ok(CreateOutcome {
            node: None,
            cloud_id: None,
            detail: format!("mailed {}", self.cfg.to.join(", ")),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let (subject, body) = remove_message(req, &self.agent);
        self.send(subject, body).await?;
        Ok(RemoveOutcome {
            detail: format!("mailed {}", self.cfg.to.join(", ")),
            gone: false,
        })
    }
}
