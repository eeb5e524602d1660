//! Checks CPython 3.13+'s own description of its layout, `_Py_DebugOffsets`,
//! against memtrace's table before any stack is walked: part of `probe`. A
//! minor version the table does not know, a free-threaded build or a layout
//! that differs from the table turns stacks off with a message that says
//! which, instead of walking with wrong offsets.
//!
//! `_PyRuntime` starts with the struct (`_PyRuntimeState.debug_offsets` @0,
//! Include/internal/pycore_runtime.h of 3.13): `char cookie[8] =
//! "xdebugpy"`, `uint64_t version` (`PY_VERSION_HEX`), `uint64_t
//! free_threaded`, then nested `uint64_t` offsets. The positions of the
//! nested fields below are those of 3.13 (`offsetof` against the pyenv
//! 3.13.0 headers, python-stacks.md §3); 3.14 inserts fields in the middle,
//! so each minor version needs its own positions.

use std::path::Path;

use super::mem;
use super::offsets::{self, VersionLayout};
use super::probe::{ProbeError, PythonVersion};

/// `_Py_DebugOffsets.cookie` (`_Py_Debug_Cookie`).
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// `sizeof(struct _Py_DebugOffsets)` of 3.13: the bytes [`check`] reads.
pub const DEBUG_OFFSETS_3_13_BYTES: usize = 584;

/// A field of the 3.13 struct compared with the table: its name, its
/// position in `_Py_DebugOffsets` and the value the table holds for it.
struct Field {
    name: &'static str,
    position: usize,
    table: fn(&VersionLayout) -> u64,
}

/// The 3.13 fields that memtrace's walk and resolver use.
const FIELDS_3_13: [Field; 14] = [
    field("thread_state.current_frame", 184, |l| {
        u64::from(l.walk.current_frame)
    }),
    field("interpreter_frame.previous", 232, |l| {
        u64::from(l.walk.frame_previous)
    }),
    field("interpreter_frame.executable", 240, |l| {
        u64::from(l.walk.frame_code)
    }),
    field("interpreter_frame.instr_ptr", 248, |l| {
        u64::from(l.walk.frame_instr_ptr)
    }),
    field("interpreter_frame.owner", 264, |l| {
        u64::from(l.walk.frame_owner)
    }),
    field("code_object.filename", 280, |l| l.code.filename),
    field("code_object.qualname", 296, |l| l.code.qualname),
    field("code_object.linetable", 304, |l| l.code.linetable),
    field("code_object.firstlineno", 312, |l| {
        u64::from(l.walk.code_firstlineno)
    }),
    field("code_object.co_code_adaptive", 344, |l| {
        u64::from(l.walk.code_adaptive)
    }),
    field("bytes_object.ob_size", 520, |l| l.bytes.size),
    field("bytes_object.ob_sval", 528, |l| l.bytes.data),
    field("unicode_object.state", 544, |l| l.unicode.state),
    field("unicode_object.asciiobject_size", 560, |l| {
        l.unicode.ascii_size_bytes
    }),
];

const fn field(name: &'static str, position: usize, table: fn(&VersionLayout) -> u64) -> Field {
    Field {
        name,
        position,
        table,
    }
}

/// The header of `_Py_DebugOffsets`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `version`: the `PY_VERSION_HEX` the struct describes.
    pub version_hex: u64,
    /// `free_threaded`: the build defines `Py_GIL_DISABLED` (PEP 703).
    pub free_threaded: bool,
}

/// Parses the header; `None` when `bytes` does not start with [`COOKIE`].
#[must_use]
pub fn parse_header(bytes: &[u8]) -> Option<Header> {
    if bytes.get(..COOKIE.len())? != COOKIE {
        return None;
    }
    Some(Header {
        version_hex: u64_at(bytes, 8)?,
        free_threaded: u64_at(bytes, 16)? != 0,
    })
}

/// The little-endian u64 at `position` of `bytes`.
fn u64_at(bytes: &[u8], position: usize) -> Option<u64> {
    mem::field::<8>(bytes, u64::try_from(position).ok()?).map(u64::from_le_bytes)
}

/// The layout to walk a 3.13+ interpreter with, after checking its
/// `_Py_DebugOffsets` (`debug`: the struct's first bytes, at least the
/// 24 of the header, and [`DEBUG_OFFSETS_3_13_BYTES`] for 3.13) against
/// `Py_Version` (`version_hex`) and the table.
///
/// # Errors
/// - [`ProbeError::NoDebugOffsets`]: no cookie;
/// - [`ProbeError::DebugOffsetsVersion`]: the struct describes another version;
/// - [`ProbeError::FreeThreaded`]: a `Py_GIL_DISABLED` build;
/// - [`ProbeError::OffsetsNotInTable`]: a minor version memtrace does not know;
/// - [`ProbeError::DebugOffsetsMismatch`]: a field differs from the table.
pub fn check(
    debug: &[u8],
    version_hex: u32,
    binary: &Path,
) -> Result<&'static VersionLayout, ProbeError> {
    let version = PythonVersion::from_hex(version_hex);
    let binary = binary.to_owned();
    let Some(header) = parse_header(debug) else {
        return Err(ProbeError::NoDebugOffsets { version, binary });
    };
    if header.version_hex != u64::from(version_hex) {
        return Err(ProbeError::DebugOffsetsVersion {
            version,
            binary,
            found: header.version_hex,
        });
    }
    if header.free_threaded {
        return Err(ProbeError::FreeThreaded { version, binary });
    }
    let layout = offsets::layout(version.major, version.minor);
    let fields: &[Field] = match (version.major, version.minor) {
        (3, 13) => &FIELDS_3_13,
        _ => &[],
    };
    let (Some(layout), false) = (layout, fields.is_empty()) else {
        return Err(ProbeError::OffsetsNotInTable {
            version,
            binary,
            supported: offsets::supported_versions(),
        });
    };
    compare(debug, fields, layout, version)?;
    Ok(layout)
}

/// Compares each of `fields` in `debug` with `layout`.
fn compare(
    debug: &[u8],
    fields: &[Field],
    layout: &'static VersionLayout,
    version: PythonVersion,
) -> Result<(), ProbeError> {
    for field in fields {
        let table = (field.table)(layout);
        let found = u64_at(debug, field.position);
        if found != Some(table) {
            return Err(ProbeError::DebugOffsetsMismatch {
                version,
                field: field.name,
                found,
                table,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::mem::ProcessMemory;
    use crate::python::probe::tests::spawn;
    use crate::python::probe::{probe, Probe};

    /// `_Py_DebugOffsets` as a 3.13 process holds it, with `version_hex`,
    /// built from the table itself.
    fn synthetic(version_hex: u64, free_threaded: u64) -> Vec<u8> {
        let layout = offsets::layout(3, 13).unwrap();
        let mut bytes = vec![0u8; DEBUG_OFFSETS_3_13_BYTES];
        bytes[..8].copy_from_slice(COOKIE);
        bytes[8..16].copy_from_slice(&version_hex.to_le_bytes());
        bytes[16..24].copy_from_slice(&free_threaded.to_le_bytes());
        for field in &FIELDS_3_13 {
            let value = (field.table)(layout).to_le_bytes();
            bytes[field.position..field.position + 8].copy_from_slice(&value);
        }
        bytes
    }

    fn message(debug: &[u8], version_hex: u32) -> String {
        check(debug, version_hex, Path::new("libpython3.x.so"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn accepts_the_table_and_names_each_refusal() {
        let ok = synthetic(0x030d_00f0, 0);
        assert_eq!(check(&ok, 0x030d_00f0, Path::new("x")).unwrap().minor, 13);
        let next = message(&synthetic(0x030e_00f0, 0), 0x030e_00f0);
        assert!(
            next.starts_with("CPython 3.14: offsets not in memtrace's table; stacks off"),
            "{next}"
        );
        let threaded = message(&synthetic(0x030d_00f0, 1), 0x030d_00f0);
        assert!(threaded.contains("free-threaded"), "{threaded}");
        assert!(message(&ok, 0x030d_01f0).contains("describes version 0x30d00f0"));
        let mut moved = ok.clone();
        moved[248] += 8;
        let mismatch = message(&moved, 0x030d_00f0);
        assert!(
            mismatch.contains("interpreter_frame.instr_ptr is 64, memtrace's table says 56"),
            "{mismatch}"
        );
        assert!(message(&ok[..20], 0x030d_00f0).contains("cookie"));
        let mut no_cookie = ok;
        no_cookie[0] = b'y';
        assert!(message(&no_cookie, 0x030d_00f0).contains("xdebugpy"));
    }

    #[test]
    fn header_parses() {
        let header = parse_header(&synthetic(0x030d_00f0, 1)).unwrap();
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

    /// The real 3.13.0 struct matches the table; the same bytes with
    /// another minor version or the free-threaded flag are refused.
    #[test]
    fn real_3_13_debug_offsets() {
        let exe = "~/.pyenv/versions/3.13.0/bin/python3.13";
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
            .read_array::<DEBUG_OFFSETS_3_13_BYTES>(python.runtime_addr)
            .unwrap();
        let version = python.info.version_hex;
        let header = parse_header(&debug).unwrap();
        assert_eq!(header.version_hex, u64::from(version));
        assert!(!header.free_threaded);
        assert_eq!(check(&debug, version, &python.binary).unwrap().minor, 13);
        let mut next = debug;
        next[10] = 14;
        let error = check(&next, version + 0x0001_0000, &python.binary).unwrap_err();
        assert!(
            matches!(error, ProbeError::OffsetsNotInTable { .. }),
            "{error}"
        );
        let mut threaded = debug;
        threaded[16] = 1;
        let error = check(&threaded, version, &python.binary).unwrap_err();
        assert!(matches!(error, ProbeError::FreeThreaded { .. }), "{error}");
    }
}
