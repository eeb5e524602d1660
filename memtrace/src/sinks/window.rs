//! The snapshot every sink reads: one closed window of `memtrace agent`
//! (or the one window of an on-demand `record`/`run`), built from the
//! aggregator's state at the window's end. Plain data: no sink sees the
//! aggregator, and every sink sees the same numbers.

use crate::aggregate::Frame;

/// One window of the trace: what every traced process holds and grew
/// between `start_ns` and `end_ns`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Start of the window, Unix time in ns (CLOCK_REALTIME).
    pub start_ns: u64,
    /// End of the window (when it was closed), Unix time in ns.
    pub end_ns: u64,
    /// The node's host name (`host.name` in OpenTelemetry's terms), from
    /// `uname`.
    pub host_name: String,
    /// Every process image open at the window's end, by pid.
    pub processes: Vec<ProcessWindow>,
    /// The sampling period: sampled bytes each sample stands for on
    /// average (`--sample-bytes`; the run's `sample_interval_bytes`), the
    /// profiles' `period` (pprof, OTLP) in `space`/`bytes`.
    pub sample_interval_bytes: u64,
    /// memtrace's own counters since it started.
    pub health: Health,
}

/// Who a process is, in the terms a fleet groups by. Bounded per service:
/// `pid`, `start_time_ns`, `cgroup`, `pod_uid` and `container_id` identify
/// one process; aggregates over processes carry only `service_name` and
/// `role`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessLabels {
    /// The process's `OTEL_SERVICE_NAME` (from `/proc/PID/environ`), else
    /// its gunicorn/celery/uwsgi process title, else its script's name.
    pub service_name: String,
    /// `master`, `main`, `worker`, `child` or `helper`, as the report's
    /// process kinds say.
    pub role: String,
    /// Its tgid.
    pub pid: u32,
    /// Its start time as in `/proc/PID/stat` (ns since boot): with `pid`,
    /// the process's identity.
    pub start_time_ns: u64,
    /// Its cgroup v2 path (`/proc/PID/cgroup`, the `0::` line).
    pub cgroup: String,
    /// On Kubernetes: the pod's UID, from the cgroup path
    /// (`kubepods…/pod<uid>/…`).
    pub pod_uid: Option<String>,
    /// On Kubernetes (or any container engine): the container id, the
    /// cgroup path's last component without its engine prefix.
    pub container_id: Option<String>,
}

/// One process image at the window's end. RSS figures are the kernel's
/// exact counters (`kmem:rss_stat`), read at the window's end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessWindow {
    /// Who it is.
    pub labels: ProcessLabels,
    /// RSS now: `anon_bytes + file_bytes + shmem_bytes` (VmRSS).
    pub resident_bytes: u64,
    /// Resident anonymous memory (RssAnon).
    pub anon_bytes: u64,
    /// Resident file-backed memory (RssFile).
    pub file_bytes: u64,
    /// Resident shared memory (RssShmem).
    pub shmem_bytes: u64,
    /// Proportional set size at the last `/proc/PID/smaps_rollup` read
    /// (`None` before the first).
    pub pss_bytes: Option<u64>,
    /// Private memory (Private_Clean + Private_Dirty) at that read.
    pub uss_bytes: Option<u64>,
    /// RSS now minus RSS when tracing of this image began (a fork: what it
    /// inherited), negative when it shrank.
    pub growth_bytes: i64,
    /// Copy-on-write faults times the page size since tracing of this image
    /// began (a counter: it only rises).
    pub cow_bytes_total: u64,
    /// Its growth paths with anything held or grown, largest held first.
    pub paths: Vec<PathWindow>,
}

/// One growth path of one process: a stack and its sampled bytes (sampled
/// estimates, weighted so totals stay unbiased).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathWindow {
    /// The stack, root (outermost) first, innermost last, as the pprof
    /// report has it: Python frames (function, file, line), the native
    /// frames under the innermost Python line, and for file-backed or
    /// shared memory the mapping last.
    pub frames: Vec<Frame>,
    /// Bytes it holds at the window's end (`inuse_space`).
    pub held_bytes: u64,
    /// Bytes it made resident within the window (`alloc_space`).
    pub grown_bytes: u64,
    /// Bytes it held when its process's RSS was highest (`peak_space`).
    pub peak_held_bytes: u64,
    /// Copy-on-write bytes it un-shared within the window (`cow_space`).
    pub cow_bytes: u64,
}

/// memtrace's own counters, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Ring-buffer records read.
    pub records_read: u64,
    /// Ring-buffer records the kernel dropped (a full buffer).
    pub records_dropped: u64,
    /// Windows closed and handed to the sinks, this one included.
    pub windows_emitted: u64,
    /// Sends that failed, over every sink.
    pub sink_errors: u64,
    /// Windows sinks dropped without delivering them (a full queue, retries
    /// exhausted), over every sink.
    pub windows_dropped: u64,
    /// memtrace's own RSS (VmRSS of `/proc/self/status`).
    pub own_resident_bytes: u64,
}

/// A backend a window is sent to. `send` is called on the agent's window
/// thread, never on the ring-buffer reader's: a sink that talks to the
/// network bounds its own time (timeouts, a bounded queue with retries).
pub trait Sink {
    /// Its name in logs and in memtrace's health metrics (`prometheus`,
    /// `otlp`, `pyroscope`).
    fn name(&self) -> &str;

    /// Where it delivers, for the agent's start line (`prometheus at
    /// http://127.0.0.1:9464/metrics`); its name by default.
    fn destination(&self) -> String {
        self.name().to_owned()
    }

    /// Delivers (or queues) one window.
    ///
    /// # Errors
    /// The window was not delivered nor queued; the agent counts it in
    /// [`Health::sink_errors`] and logs it, and sends the next window.
    fn send(&mut self, window: &Window) -> anyhow::Result<()>;

    /// Windows this sink dropped so far without delivering them (a full
    /// queue, retries exhausted); 0 for a sink that never queues.
    fn windows_dropped(&self) -> u64 {
        0
    }

    /// Sends that failed so far on the sink's own thread (each failed
    /// attempt of a queued sink); 0 for a sink that sends on the window
    /// thread, whose failures `send` returns.
    fn send_errors(&self) -> u64 {
        0
    }
}
