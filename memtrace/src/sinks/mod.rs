//! Sinks step of the data flow, after `aggregate`: `memtrace agent` closes a
//! [`Window`] every `--interval` (a plain snapshot built from the
//! aggregator's state, the same state the reporters read) and hands it to
//! each sink, which turns it into what one backend expects.

pub mod otlp;
pub mod prometheus;
pub mod pyroscope;
pub mod queue;
pub mod samples;
pub mod window;

pub use window::{Health, PathWindow, ProcessLabels, ProcessWindow, Sink, Window};

use anyhow::Result;

use crate::cli::ProfileSinkArgs;

/// The profile sinks `args` asks for (`--otlp`, `--pyroscope`), each on a
/// thread of its own with the default [`queue::Policy`].
///
/// # Errors
/// A URL that is not `http://HOST[:PORT][/PATH]`, or a thread that cannot
/// be started.
pub fn open_profile_sinks(args: &ProfileSinkArgs) -> Result<Vec<Box<dyn Sink>>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(url) = &args.otlp {
        queue::check_url("--otlp", url)?;
        let encoder = otlp::OtlpEncoder::new(url);
        sinks.push(Box::new(queue::QueuedSink::start(
            "otlp",
            encoder,
            queue::Policy::default(),
        )?));
    }
    if let Some(url) = &args.pyroscope {
        queue::check_url("--pyroscope", url)?;
        let encoder = pyroscope::PyroscopeEncoder::new(url, args.pyroscope_tenant.clone());
        sinks.push(Box::new(queue::QueuedSink::start(
            "pyroscope",
            encoder,
            queue::Policy::default(),
        )?));
    }
    Ok(sinks)
}
