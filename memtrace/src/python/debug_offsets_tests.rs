//! Tests of `debug_offsets`: synthetic structs for each refusal, and the
//! real structs of pyenv's 3.13.0 and Debian's 3.14 and 3.15.

use super::*;
use crate::python::mem::ProcessMemory;
use crate::python::probe::tests::{debian_python, spawn};
use crate::python::probe::{probe, Probe};
use std::path::Path;

/// A 3.14 `_Py_DebugOffsets` with the values of Debian's 3.14.10
/// (`frame_owner` 74, `co_code_adaptive` 208: python-stacks.md §2).
fn synthetic_3_14(version_hex: u64, free_threaded: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; DEBUG_OFFSETS_READ_BYTES];
    let mut put = |at: usize, value: u64| bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    put(8, version_hex);
    put(16, free_threaded);
    let structs: [NestedStruct; 9] = [
        (24, 2400, &[(16, 808)]),
        (48, 8000, &[(16, 0), (24, 7344)]),
        (176, 300, &[(16, 8), (24, 16), (32, 72), (40, 152)]),
        (248, 80, &[(8, 8), (16, 0), (24, 56), (40, 74)]),
        (
            312,
            216,
            &[(8, 112), (24, 128), (32, 136), (40, 68), (72, 208)],
        ),
        (592, 33, &[(8, 16), (16, 32)]),
        (616, 40, &[(8, 32), (16, 16), (24, 40)]),
        (400, 16, &[(8, 8)]),
        (416, 416, &[(8, 24)]),
    ];
    for (start, size, fields) in structs {
        put(start, size);
        for &(at, value) in fields {
            put(start + at, value);
        }
    }
    bytes[..8].copy_from_slice(COOKIE);
    bytes
}

/// A nested struct: its start, its size, and (position in it, value) of
/// its fields.
type NestedStruct = (usize, u64, &'static [(usize, u64)]);

fn message(debug: &[u8], version_hex: u32) -> String {
    check(debug, version_hex, Path::new("python3.x"))
        .unwrap_err()
        .to_string()
}

#[test]
fn reads_3_14_and_names_each_refusal() {
    let ok = synthetic_3_14(0x030e_0af0, 0);
    let layout = check(&ok, 0x030e_0af0, Path::new("x")).unwrap();
    assert_eq!(layout.walk.frame_owner, 74);
    assert_eq!(layout.walk.code_adaptive, 208);
    assert_eq!(layout.walk.current_frame, 72);
    assert_eq!(layout.threads.interpreters_head, 808);
    assert_eq!(layout.threads.tstate_thread_id, 152);
    assert_eq!(layout.unicode.compact_size_bytes, 56);
    assert_eq!(layout.walk.code_shape, 16);
    assert_eq!(
        layout.object,
        ObjectLayout {
            ob_type: 8,
            tp_name: 24
        }
    );
    // A newer minor is read with the newest positions (3.15's, where
    // thread_id moved): here they do not fit 3.14's struct.
    assert_eq!(
        positions(16).map(|(p, known)| (p.minor, known)),
        Some((15, false))
    );
    assert!(positions(12).is_none());
    let threaded = message(&synthetic_3_14(0x030e_0af0, 1), 0x030e_0af0);
    assert!(threaded.contains("free-threaded"), "{threaded}");
    assert!(message(&ok, 0x030e_0bf0).contains("describes version 0x30e0af0"));
    let mut past = ok.clone();
    past[248 + 40] = 90; // owner at 90 in an 80-byte frame
    let past = message(&past, 0x030e_0af0);
    assert!(
        past.contains("_Py_DebugOffsets.interpreter_frame.owner is 90: a 1-byte field there ends past its struct's size 80"),
        "{past}"
    );
    let mut wide = ok.clone();
    wide[312..320].copy_from_slice(&100_000u64.to_le_bytes());
    wide[312 + 72..312 + 80].copy_from_slice(&70_000u64.to_le_bytes());
    let wide = message(&wide, 0x030e_0af0);
    assert!(
        wide.contains("code_object.co_code_adaptive is 70000: the BPF walk"),
        "{wide}"
    );
    assert!(message(&ok[..200], 0x030e_0af0).contains("past the bytes read"));
    let mut no_cookie = ok;
    no_cookie[0] = b'y';
    assert!(message(&no_cookie, 0x030e_0af0).contains("xdebugpy"));
}

#[test]
fn header_parses() {
    let header = parse_header(&synthetic_3_14(0x030d_00f0, 1)).unwrap();
    assert_eq!(
        header,
        Header {
            version_hex: 0x030d_00f0,
            free_threaded: true
        }
    );
    assert_eq!(parse_header(b"xdebugpy"), None);
    assert_eq!(parse_header(&[0; 24]), None);
}

/// The real structs give the walk the offsets python-stacks.md §2 lists
/// (3.13 [V], 3.14 [B]); the same bytes with the free-threaded flag are
/// refused from 3.14 on (3.13t is read).
fn real(exe: &str, owner: u16, adaptive: u16) {
    let script = "import time; print('ready', flush=True); time.sleep(60)";
    let Some(interp) = spawn(exe, script) else {
        return;
    };
    let tgid = interp.child.id();
    let Probe::Python(python) = probe(tgid).unwrap() else {
        panic!("{exe} not detected");
    };
    let memory = ProcessMemory::open(tgid).unwrap();
    let debug = memory
        .read_array::<DEBUG_OFFSETS_READ_BYTES>(python.runtime_addr)
        .unwrap();
    let version = python.info.version_hex;
    let layout = check(&debug, version, &python.binary).unwrap();
    assert_eq!(
        (layout.walk.frame_owner, layout.walk.code_adaptive),
        (owner, adaptive)
    );
    assert_eq!(layout.walk, python.info.offsets);
    assert_remote_debug(&memory, &debug, python.runtime_addr, version);
    let mut threaded = debug;
    threaded[16] = 1;
    let threaded = check(&threaded, version, &python.binary);
    if python.version.minor == 13 {
        assert!(threaded.unwrap().free_threaded);
    } else {
        let error = threaded.unwrap_err();
        assert!(matches!(error, ProbeError::FreeThreaded { .. }), "{error}");
    }
}

/// PEP 768's fields, on 3.14+ only: the support struct's fields in their
/// places (`_PyRemoteDebuggerSupport` is an `int32_t` then the 512-byte
/// path), the main interpreter and thread found, remote debugging enabled
/// and no call pending.
fn assert_remote_debug(memory: &ProcessMemory, debug: &[u8], runtime: u64, version: u32) {
    let Some(remote) = remote_debug(debug, version) else {
        assert!(PythonVersion::from_hex(version).minor < 14);
        return;
    };
    assert_eq!(
        (
            remote.pending_call,
            remote.script_path,
            remote.script_path_bytes
        ),
        (0, 4, 512)
    );
    let interp = memory.read_u64(runtime + remote.interpreters_head).unwrap();
    let main = memory.read_u64(interp + remote.threads_main).unwrap();
    assert_ne!(main, 0);
    assert_eq!(memory.read_u32(interp + remote.enabled).unwrap(), 1);
    let pending = main + remote.support + remote.pending_call;
    assert_eq!(memory.read_u32(pending).unwrap(), 0);
}

#[test]
fn real_3_13_debug_offsets() {
    real("~/.pyenv/versions/3.13.0/bin/python3.13", 70, 200);
}

#[test]
fn real_3_14_debug_offsets() {
    real(&debian_python("3.14"), 74, 208);
}

#[test]
fn real_3_15_debug_offsets() {
    real(&debian_python("3.15"), 74, 208);
}

/// The free-threaded 3.13t that `cargo xtask test` builds: its larger
/// `PyObject` header (`ob_tid`, `ob_mutex`, `ob_gc_bits`, `ob_ref_local`,
/// `ob_ref_shared`: 32 bytes before `ob_size`) comes from its own debug
/// offsets, and its frames are 3.13's.
#[test]
fn real_3_13t_debug_offsets() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let exe = root.join("target/interpreters/python3.13t/bin/python3.13t");
    let script = "import time; print('ready', flush=True); time.sleep(60)";
    let Some(interp) = spawn(&exe.to_string_lossy(), script) else {
        return;
    };
    let Probe::Python(python) = probe(interp.child.id()).unwrap() else {
        panic!("{} not detected", exe.display());
    };
    assert!(python.free_threaded);
    let memory = ProcessMemory::open(interp.child.id()).unwrap();
    let debug = memory
        .read_array::<DEBUG_OFFSETS_READ_BYTES>(python.runtime_addr)
        .unwrap();
    let layout = check(&debug, python.info.version_hex, &python.binary).unwrap();
    assert_eq!(layout.walk.code_shape, 32);
    // Code-object fields move by the 16 header bytes (pyenv's 3.13.0:
    // 68, 200, 128); the frame and thread-state fields stay.
    let walk = &layout.walk;
    assert_eq!(
        (walk.code_firstlineno, walk.code_adaptive, walk.code_name),
        (84, 216, 144)
    );
    assert_eq!((walk.current_frame, walk.frame_owner), (72, 70));
    assert_eq!(
        (layout.unicode.state, layout.unicode.ascii_size_bytes),
        (48, 56)
    );
    assert_eq!(
        layout.object,
        ObjectLayout {
            ob_type: 24,
            tp_name: 40
        }
    );
}

#[test]
fn remote_debug_reads_the_support_part_and_refuses_what_cannot_be_it() {
    const V3_14: u32 = 0x030e_0af0;
    let mut debug = synthetic_3_14(u64::from(V3_14), 0);
    // All zeros: a 0-byte path buffer is not the support part.
    assert_eq!(remote_debug(&debug, V3_14), None);
    for (i, value) in [24u64, 304, 8076, 0, 4, 512].into_iter().enumerate() {
        let at = 712 + 8 * i;
        debug[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    debug[80..88].copy_from_slice(&7360u64.to_le_bytes());
    let layout = remote_debug(&debug, V3_14).unwrap();
    assert_eq!(
        layout,
        RemoteDebugLayout {
            interpreters_head: 808,
            threads_main: 7360,
            eval_breaker: 24,
            support: 304,
            enabled: 8076,
            pending_call: 0,
            script_path: 4,
            script_path_bytes: 512,
        }
    );
    // 3.13 has no such part; a minor version not known is not guessed at.
    assert_eq!(remote_debug(&debug, 0x030d_00f0), None);
    assert_eq!(remote_debug(&debug, 0x0310_00f0), None);
}
