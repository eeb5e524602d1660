//! Grafana Pyroscope encoder of the sinks step: a [`Window`] as one
//! `POST /ingest?name=…&from=…&until=…&format=pprof` per `(service_name,
//! role)`, the body a gzipped pprof profile written with the pprof
//! report's builder (`crate::report::pprof`). One series per service and
//! role, not per process: a pid label on the series would multiply them at
//! every restart; each sample carries its process (`tgid`, `instance`) as
//! pprof sample labels instead.

use anyhow::Result;

use super::queue::{Encode, Request};
use super::samples::{by_service_and_role, process_samples, SAMPLE_TYPES};
use super::window::{ProcessWindow, Window};
use crate::aggregate::Frame;
use crate::report::pprof::{write_gzipped, Builder, ProfileMeta, SampleProcess};

/// Turns windows into Pyroscope `/ingest` requests.
#[derive(Debug, Clone)]
pub struct PyroscopeEncoder {
    ingest_url: String,
    tenant: Option<String>,
}

impl PyroscopeEncoder {
    /// Requests to `base_url` (e.g. `http://pyroscope:4040`; `/ingest` is
    /// appended), with `X-Scope-OrgID: tenant` when one is given.
    pub fn new(base_url: &str, tenant: Option<String>) -> Self {
        Self {
            ingest_url: format!("{}/ingest", base_url.trim_end_matches('/')),
            tenant,
        }
    }
}

impl Encode for PyroscopeEncoder {
    fn requests(&self, window: &Window) -> Result<Vec<Request>> {
        by_service_and_role(window)
            .into_iter()
            .map(|((service_name, role), processes)| {
                let mut body = Vec::new();
                write_gzipped(&profile(window, &processes), &mut body)?;
                let mut headers = vec![("Content-Type", "application/octet-stream".to_owned())];
                if let Some(tenant) = &self.tenant {
                    headers.push(("X-Scope-OrgID", tenant.clone()));
                }
                Ok(Request {
                    url: self.ingest_url.clone(),
                    query: vec![
                        ("name", series_name(service_name, role, &window.host_name)),
                        ("from", (window.start_ns / 1_000_000_000).to_string()),
                        ("until", window.end_ns.div_ceil(1_000_000_000).to_string()),
                        ("format", "pprof".to_owned()),
                        ("spyName", "memtrace".to_owned()),
                    ],
                    headers,
                    body,
                })
            })
            .collect()
    }
}

/// Pyroscope's application name with its labels:
/// `SERVICE{role=ROLE,host_name=HOST}` (Pyroscope makes the part before
/// `{` the `service_name` label). Label values lose `,`, `{`, `}` and `=`,
/// which the name's syntax reserves.
pub fn series_name(service_name: &str, role: &str, host_name: &str) -> String {
    let clean = |text: &str| text.replace([',', '{', '}', '='], "_");
    format!(
        "{}{{role={},host_name={}}}",
        clean(service_name),
        clean(role),
        clean(host_name)
    )
}

/// The pprof profile of `processes` in `window`: the four sample types,
/// `inuse_space` shown by default, one sample per (process, path), the
/// window's sampling period (`space`/`bytes`).
pub(crate) fn profile(
    window: &Window,
    processes: &[&ProcessWindow],
) -> crate::report::pprof::Profile {
    let mut builder: Builder<'_, Frame> = Builder::new(&SAMPLE_TYPES);
    for process in processes {
        let label = format!("{} {}", process.labels.service_name, process.labels.role);
        let name = format!("pid {}", process.labels.pid);
        let sample_process = SampleProcess {
            tgid: process.labels.pid,
            label: &label,
            name: &name,
        };
        for sample in process_samples(process) {
            builder.sample(
                sample.frames.iter().rev(),
                sample.values.to_vec(),
                &sample_process,
            );
        }
    }
    builder.finish(&ProfileMeta {
        comment: Vec::new(),
        duration_ns: window.end_ns.saturating_sub(window.start_ns),
        sample_interval_bytes: window.sample_interval_bytes,
        default_sample_type: SAMPLE_TYPES[0].0,
    })
}
