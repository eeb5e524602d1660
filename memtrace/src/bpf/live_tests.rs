//! Live check of the whole kernel side (ignored by default: needs root, a
//! BTF kernel and pyenv's CPython 3.11/3.12/3.13): loads and attaches the
//! programs, traces each real interpreter that grows by 100 MiB in a named function and
//! forks a child that grows by 20 MiB, and checks counters, sampled records
//! and their Python stacks. Run: `cargo test -p memtrace bpf::live_tests --
//! --ignored --nocapture` as root.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use memtrace_common::{
    ExitRecord, ForkRecord, MemoryEvent, MemoryRecord, ProcessCounters, MM_ANONPAGES,
};

use super::{Tracer, TracerOptions};
use crate::events::Record;
use crate::python::{probe, FrameResolver, Probe};

/// Grows by 100 MiB (touched bytes) in `grow_memory` and by 10 MiB of
/// malloc heap (brk) in `grow_heap`, then forks a child
/// that grows by 20 MiB in `child_grow`; waits for a line on stdin before
/// each step so the test can register the process and drain records.
const SCRIPT: &str = r#"
import os, sys
def grow_memory():
    return b"\x01" * (100 << 20)
def outer():
    return grow_memory()
def child_grow():
    return b"\x02" * (20 << 20)
def grow_heap():
    return [bytearray(b"\x03" * 65536) for _ in range(160)]
print("ready", flush=True)
sys.stdin.readline()
kept = outer()
heap = grow_heap()
pid = os.fork()
if pid == 0:
    child_grow()
    os._exit(0)
os.waitpid(pid, 0)
print("done", flush=True)
sys.stdin.readline()
"#;

const MIB: u64 = 1 << 20;

/// pyenv interpreters to trace: (version directory, executable).
const INTERPRETERS: [(&str, &str); 3] = [
    ("3.11.7", "python3.11"),
    ("3.12.1", "python3.12"),
    ("3.13.0", "python3.13"),
];

fn pyenv_python(version: &str, executable: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = PathBuf::from(home).join(format!(".pyenv/versions/{version}/bin/{executable}"));
    path.exists().then_some(path)
}

struct Interpreter {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Interpreter {
    fn spawn(python: &PathBuf) -> Self {
        let mut child = Command::new(python)
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn expect_line(&mut self, want: &str) {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read python stdout");
        assert_eq!(line.trim(), want);
    }

    fn step(&mut self) {
        self.stdin.write_all(b"\n").expect("write python stdin");
    }
}

/// Everything decoded from the ring buffer.
#[derive(Default)]
struct Drained {
    forks: Vec<ForkRecord>,
    exits: Vec<ExitRecord>,
    memory: Vec<MemoryRecord>,
    addresses: usize,
    exit_begins: usize,
}

fn drain(ring: &mut aya::maps::RingBuf<aya::maps::MapData>, drained: &mut Drained) {
    while let Some(item) = ring.next() {
        match crate::events::decode(&item).expect("every record decodes") {
            Record::Fork(fork) => drained.forks.push(fork),
            Record::Exit(exit) => drained.exits.push(exit),
            Record::Memory(memory) => drained.memory.push(*memory),
            Record::Address(_) => drained.addresses += 1,
            Record::ExitBegin(_) => drained.exit_begins += 1,
            Record::Exec(_) | Record::Alloc(_) | Record::Free(_) | Record::NativeStack(_) => {}
        }
    }
}

fn wait_for_python(tgid: u32) -> crate::python::PythonProcess {
    let start = Instant::now();
    loop {
        match probe(tgid).expect("probe") {
            Probe::Python(process) => return *process,
            other => assert!(start.elapsed() < Duration::from_secs(10), "{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs root, a BTF kernel and pyenv CPython 3.11-3.13; run with --ignored"]
fn traces_python_growth_with_stacks() {
    for (version, executable) in INTERPRETERS {
        match pyenv_python(version, executable) {
            Some(python) => trace_one(&python),
            None => eprintln!("skipping: ~/.pyenv/versions/{version} is absent"),
        }
    }
}

fn trace_one(python: &PathBuf) {
    let options = TracerOptions {
        allocations: false,
        sample_interval_bytes: 512 << 10,
        follow_forks: true,
        wakeup_threshold_bytes: 256 << 10,
        ring_bytes: None,
    };
    let mut tracer = Tracer::load(&options).expect("load");
    for size in tracer.program_sizes().expect("program sizes") {
        println!(
            "program {:<20} verified_insns {:>6?} translated_bytes {:>6?}",
            size.name, size.verified_instructions, size.translated_bytes
        );
    }
    tracer.attach().expect("attach");
    let mut ring = tracer.take_records().expect("ring buffer");

    let mut interpreter = Interpreter::spawn(python);
    interpreter.expect_line("ready");
    let tgid = interpreter.child.id();
    let process = wait_for_python(tgid);
    println!(
        "python {} tss_slot_offset {:#x} offsets {:?}",
        process.version, process.info.tss_slot_offset, process.info.offsets
    );
    tracer
        .trace_process(tgid, ProcessCounters::default())
        .expect("trace");
    tracer.set_python(tgid, process.info).expect("set python");
    let mut resolver = FrameResolver::new();
    resolver.register(tgid, &process);

    let mut drained = Drained::default();
    interpreter.step();
    interpreter.expect_line("done");
    drain(&mut ring, &mut drained);

    let counters: BTreeMap<u32, ProcessCounters> =
        tracer.counters().expect("counters").into_iter().collect();
    let parent = counters[&tgid];
    println!("parent counters: {parent:?}");
    assert_eq!(drained.forks.len(), 1, "one fork record");
    let fork = drained.forks[0];
    let child_tgid = fork.child_tgid;
    // The child inherits the parent's ~110 MiB of anonymous memory.
    assert!(
        fork.child_rss_bytes[MM_ANONPAGES] >= 100 * MIB,
        "{:?}",
        fork.child_rss_bytes
    );
    assert!(fork.child_start_boottime_ns > 0);
    assert!(
        !counters.contains_key(&child_tgid),
        "the kernel side forgets an exited process"
    );
    let exit = drained
        .exits
        .iter()
        .find(|e| e.header.tgid == child_tgid)
        .expect("child exit record");
    let child = exit.counters;
    println!("child {child_tgid} counters at exit: {child:?}");
    assert_eq!(child.parent_tgid, tgid);
    assert_eq!(exit.exit_code, 0, "os._exit(0)");
    assert_eq!(exit.oom_victim, 0, "os._exit(0) is no OOM kill");
    assert_eq!(drained.exit_begins, 1, "the child's exit_group");
    assert!(
        parent.anon_growth_bytes >= 100 * MIB,
        "{}",
        parent.anon_growth_bytes
    );
    assert!(
        child.anon_growth_bytes >= 20 * MIB,
        "{}",
        child.anon_growth_bytes
    );
    assert!(parent.rss_known & (1 << MM_ANONPAGES) != 0);
    // Growth events come as the kernel folds its per-CPU RSS deltas
    // (batches of 32 pages or more), plus copy-on-write faults.
    assert!(
        parent.page_faults >= 100 * MIB / (256 << 10),
        "{}",
        parent.page_faults
    );
    assert!(
        parent.mmap_bytes >= 100 * MIB,
        "the 100 MiB bytes object is mmapped"
    );

    let mut by_event: BTreeMap<(u32, u32), (usize, u64)> = BTreeMap::new();
    let mut statuses: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    let mut grow_memory_weight = 0u64;
    for record in &drained.memory {
        let entry = by_event
            .entry((record.header.tgid, record.event))
            .or_default();
        entry.0 += 1;
        entry.1 += record.weight_bytes;
        *statuses
            .entry((record.frame_count, record.stack_status))
            .or_default() += 1;
        let names: Vec<String> = record.frames[..record.frame_count as usize]
            .iter()
            .filter_map(|frame| resolver.resolve(record.header.tgid, frame).ok())
            .map(|location| format!("{}:{}", location.function, location.line))
            .collect();
        if record.header.tgid == tgid
            && record.event == MemoryEvent::AnonGrowth as u32
            && names
                .first()
                .is_some_and(|name| name.starts_with("grow_memory:"))
        {
            grow_memory_weight += record.weight_bytes;
        }
    }
    for ((record_tgid, event), (count, weight)) in &by_event {
        println!(
            "tgid {record_tgid} event {:?}: {count} records, weight {:.1} MiB",
            MemoryEvent::try_from(*event),
            *weight as f64 / MIB as f64
        );
    }
    println!("(frame_count, stack_status) -> records: {statuses:?}");
    println!(
        "AnonGrowth weight under grow_memory: {:.1} MiB",
        grow_memory_weight as f64 / MIB as f64
    );
    println!(
        "dropped records: {}",
        tracer.dropped_records().expect("dropped")
    );
    let anon_weight = by_event[&(tgid, MemoryEvent::AnonGrowth as u32)].1;
    assert!(
        anon_weight > 80 * MIB && anon_weight < 140 * MIB,
        "sampled AnonGrowth weight {anon_weight} estimates ~100 MiB"
    );
    assert!(
        grow_memory_weight > 70 * MIB,
        "most growth is attributed to grow_memory: {grow_memory_weight}"
    );
    assert_eq!(tracer.dropped_records().expect("dropped"), 0);

    assert!(
        drained.addresses > 0,
        "frees of the interpreter give memory back"
    );

    interpreter.step();
    interpreter.child.wait().expect("python exits");
    assert!(
        tracer.counters().expect("counters").is_empty(),
        "the kernel side forgets both processes at exit"
    );
}
