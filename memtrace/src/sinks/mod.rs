//! Sinks step of the data flow, after `aggregate`: `memtrace agent` closes a
//! [`Window`] every `--interval` (a plain snapshot built from the
//! aggregator's state, the same state the reporters read) and hands it to
//! each sink, which turns it into what one backend expects.

pub mod prometheus;
pub mod window;

pub use window::{Health, PathWindow, ProcessLabels, ProcessWindow, Sink, Window};
