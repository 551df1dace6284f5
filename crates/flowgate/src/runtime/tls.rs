//! TLS on the OpenFlow channel, as Open vSwitch's `ssl:` controller targets use it: the
//! controller presents its certificate and, when a CA is configured, requires each switch
//! to present one signed by it (OVS always sends its own certificate).

use std::fs::File;
use std::io::BufReader;
use std::sync::Arc;

use anyhow::{Context, bail};
use flowgate_core::config::TlsConfig;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

pub(super) fn acceptor(cfg: &TlsConfig) -> anyhow::Result<TlsAcceptor> {
    let certs = rustls_pemfile::certs(&mut BufReader::new(
        File::open(&cfg.cert)
            .with_context(|| format!("openflow.tls.cert: cannot open {}", cfg.cert.display()))?,
    ))
    .collect::<Result<Vec<_>, _>>()
    .with_context(|| format!("openflow.tls.cert: {} is not PEM", cfg.cert.display()))?;
    if certs.is_empty() {
        bail!(
            "openflow.tls.cert: {} holds no certificate",
            cfg.cert.display()
        );
    }
    let key = rustls_pemfile::private_key(&mut BufReader::new(
        File::open(&cfg.key)
            .with_context(|| format!("openflow.tls.key: cannot open {}", cfg.key.display()))?,
    ))
    .with_context(|| format!("openflow.tls.key: {} is not PEM", cfg.key.display()))?
    .with_context(|| {
        format!(
            "openflow.tls.key: {} holds no private key",
            cfg.key.display()
        )
    })?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match &cfg.ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut BufReader::new(
                File::open(ca)
                    .with_context(|| format!("openflow.tls.ca: cannot open {}", ca.display()))?,
            )) {
                roots.add(
                    c.with_context(|| format!("openflow.tls.ca: {} is not PEM", ca.display()))?,
                )?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key)?
        }
        None => builder.with_no_client_auth().with_single_cert(certs, key)?,
    };
    Ok(TlsAcceptor::from(Arc::new(config)))
}
