//! Resolves the Python frames BPF recorded (`PyFrame`: code-object address,
//! instruction index, `co_firstlineno` fingerprint) to function, file and
//! line by reading code objects through /proc/PID/mem: the last step of the
//! `python` stage, called by the app for every frame of every
//! `MemoryRecord` before aggregation.
//!
//! Code objects are cached per (tgid, address) and accepted only while their
//! `co_firstlineno` equals the one BPF read (python-stacks.md §6: the frame
//! held a reference, so a mismatch means the address was reused since).
//! Lines are memoised per (code object, instruction index). A forked child
//! shares its parent's code objects at the same addresses, so a code object
//! missing from the child's cache is first looked up (with the same
//! fingerprint check) in its ancestors' caches, then read from the child's
//! memory, and when that can no longer be read (it exited before its
//! records were resolved) from its ancestors' memory.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use memtrace_common::{code_fingerprint, PyFrame};
use thiserror::Error;

use super::linetable::{self, LineTableError};
use super::lnotab;
use super::mem::{field, MemError, ProcessMemory, MAX_STRING_BYTES, MAX_TABLE_BYTES};
use super::offsets::{LineFormat, UnicodeLayout, VersionLayout};
use super::probe::PythonProcess;

/// Where a Python frame was.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyLocation {
    /// `co_qualname`, e.g. `Cache.put` or `main.<locals>.worker`.
    pub function: String,
    /// `co_filename` as the interpreter saw it (may be relative).
    pub file: String,
    /// Line of the current instruction; `co_firstlineno` for a frame that has
    /// not started; 0 for instructions that have no line (code 15 of the
    /// location table).
    pub line: u32,
}

/// Why a frame could not be resolved.
#[derive(Debug, Error)]
pub enum ResolveError {
    /// The process was never registered (or was forgotten).
    #[error("process {tgid} is not a registered python process")]
    UnknownProcess {
        /// The process.
        tgid: u32,
    },
    /// Neither the process nor any ancestor it inherited from could be read.
    #[error("cannot read code object {code_addr:#x} of process {tgid}: {source}")]
    Memory {
        /// The process.
        tgid: u32,
        /// The code object.
        code_addr: u64,
        /// The last failed read.
        #[source]
        source: MemError,
    },
    /// /proc/PID/mem of the process and of every ancestor it inherited
    /// from could not be opened (they had exited when registered).
    #[error(
        "no memory of process {tgid} or of its ancestors is open (they had exited when registered)"
    )]
    NoMemory {
        /// The process.
        tgid: u32,
    },
    /// The code object's fingerprint (`co_firstlineno` and name pointer,
    /// `memtrace_common::code_fingerprint`) differs from the one BPF read:
    /// the address now holds another code object (or garbage).
    #[error("code object {code_addr:#x} of process {tgid} has fingerprint {found:#x}, the frame said {expected:#x}")]
    FingerprintMismatch {
        /// The process.
        tgid: u32,
        /// The code object.
        code_addr: u64,
        /// The fingerprint of the BPF frame.
        expected: u32,
        /// The fingerprint of the code object read now.
        found: u32,
    },
    /// A str object that is not a compact str of kind 1, 2 or 4.
    #[error("object {addr:#x} of process {tgid} is not a compact str (state {state:#x})")]
    BadString {
        /// The process.
        tgid: u32,
        /// The object.
        addr: u64,
        /// Its `state` bit field.
        state: u32,
    },
    /// The location table did not decode.
    #[error("line of instruction {instr_index} in code object {code_addr:#x} of process {tgid}: {source}")]
    LineTable {
        /// The process.
        tgid: u32,
        /// The code object.
        code_addr: u64,
        /// The instruction index.
        instr_index: i32,
        /// The decoding error.
        #[source]
        source: LineTableError,
    },
}

/// Resolves [`PyFrame`]s of registered processes to [`PyLocation`]s.
#[derive(Debug, Default)]
pub struct FrameResolver {
    processes: HashMap<u32, Registered>,
}

/// A registered process.
#[derive(Debug)]
struct Registered {
    layout: VersionLayout,
    /// Opened at registration so a later tgid reuse cannot redirect reads;
    /// `None` when the process was already gone.
    memory: Option<ProcessMemory>,
    /// The process whose code objects this one inherited at fork.
    parent: Option<u32>,
    /// Code objects by address.
    codes: HashMap<u64, CodeObject>,
}

/// The parts of a `PyCodeObject` a location needs.
#[derive(Clone, Debug)]
struct CodeObject {
    first_lineno: i32,
    /// The fingerprint BPF computes for it ([`code_fingerprint`] of its
    /// first line, the address of its name str (`co_qualname`, or
    /// `co_name` on 3.9/3.10) and the shape word at `walk.code_shape`).
    fingerprint: u32,
    function: String,
    file: String,
    linetable: Vec<u8>,
    /// How `linetable` encodes lines.
    format: LineFormat,
    /// Memo: instruction index → line.
    lines: HashMap<i32, u32>,
}

impl FrameResolver {
    /// An empty resolver.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts resolving frames of `tgid`, probed as `python`. Registering
    /// again (after an exec) drops what was cached for the old image.
    pub fn register(&mut self, tgid: u32, python: &PythonProcess) {
        self.processes.insert(
            tgid,
            Registered {
                layout: python.layout,
                memory: ProcessMemory::open(tgid).ok(),
                parent: None,
                codes: HashMap::new(),
            },
        );
    }

    /// Registers `child_tgid`, forked from `parent_tgid`, with the parent's
    /// layout; its code objects fall back to the parent's memory. Returns
    /// false (and does nothing) when the parent is not registered.
    pub fn inherit(&mut self, child_tgid: u32, parent_tgid: u32) -> bool {
        let Some(parent) = self.processes.get(&parent_tgid) else {
            return false;
        };
        let child = Registered {
            layout: parent.layout,
            memory: ProcessMemory::open(child_tgid).ok(),
            parent: Some(parent_tgid),
            codes: HashMap::new(),
        };
        self.processes.insert(child_tgid, child);
        true
    }

    /// Drops everything about `tgid` (it exited or exec'd). Children that
    /// inherited from it keep working from their own memory.
    pub fn forget(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
    }

    /// Resolves one frame of process `tgid`.
    ///
    /// # Errors
    /// [`ResolveError`] when the process is unknown, its code object is in
    /// no cache and cannot be read from it or its ancestors, the fingerprint
    /// does not match, or the strings or location table are malformed.
    pub fn resolve(&mut self, tgid: u32, frame: &PyFrame) -> Result<PyLocation, ResolveError> {
        // Taken out while resolving so its cache can be filled from the
        // other processes' caches and memory; put back on every path.
        let mut registered = self
            .processes
            .remove(&tgid)
            .ok_or(ResolveError::UnknownProcess { tgid })?;
        let location = self.resolve_in(tgid, &mut registered, frame);
        self.processes.insert(tgid, registered);
        location
    }

    /// [`FrameResolver::resolve`] for `registered` (process `tgid`, out of
    /// `self.processes`).
    fn resolve_in(
        &self,
        tgid: u32,
        registered: &mut Registered,
        frame: &PyFrame,
    ) -> Result<PyLocation, ResolveError> {
        let code = match registered.codes.entry(frame.code_addr) {
            Entry::Occupied(cached) if cached.get().matches(frame) => cached.into_mut(),
            entry => {
                let code = match self.inherited_code(registered.parent, frame) {
                    Some(code) => code.clone(),
                    None => {
                        let own = (&registered.memory, &registered.layout);
                        self.read_code_chain(tgid, own, registered.parent, frame)?
                    }
                };
                entry.insert_entry(code).into_mut()
            }
        };
        let line = code.line(tgid, frame)?;
        Ok(PyLocation {
            function: code.function.clone(),
            file: code.file.clone(),
            line,
        })
    }

    /// `parent` and its ancestors, nearest first. Bounded by the number of
    /// registered processes (guards against a parent cycle from tgid reuse).
    fn ancestors(&self, parent: Option<u32>) -> impl Iterator<Item = &Registered> {
        std::iter::successors(parent.and_then(|t| self.processes.get(&t)), |r| {
            r.parent.and_then(|t| self.processes.get(&t))
        })
        .take(self.processes.len())
    }

    /// The frame's code object from the nearest ancestor cache that holds
    /// it with the frame's fingerprint.
    fn inherited_code(&self, parent: Option<u32>, frame: &PyFrame) -> Option<&CodeObject> {
        self.ancestors(parent)
            .filter_map(|ancestor| ancestor.codes.get(&frame.code_addr))
            .find(|code| code.matches(frame))
    }

    /// Reads the code object from process `tgid` (its `own` memory and
    /// layout), or from its ancestors (from `parent` on) when its memory is
    /// gone. A fingerprint mismatch is final: the readable process answered.
    fn read_code_chain(
        &self,
        tgid: u32,
        own: (&Option<ProcessMemory>, &VersionLayout),
        parent: Option<u32>,
        frame: &PyFrame,
    ) -> Result<CodeObject, ResolveError> {
        let mut last_error = None;
        let inherited = self.ancestors(parent).map(|r| (&r.memory, &r.layout));
        for (memory, layout) in std::iter::once(own).chain(inherited) {
            let Some(memory) = memory else {
                continue;
            };
            match CodeObject::read(memory, layout, frame.code_addr) {
                Ok(code) => return code.check(tgid, frame),
                Err(ReadError::Memory(source)) => last_error = Some(source),
                Err(ReadError::BadString { addr, state }) => {
                    return Err(ResolveError::BadString {
                        tgid: memory.tgid(),
                        addr,
                        state,
                    })
                }
            }
        }
        Err(match last_error {
            Some(source) => ResolveError::Memory {
                tgid,
                code_addr: frame.code_addr,
                source,
            },
            None => ResolveError::NoMemory { tgid },
        })
    }
}

/// A failed read of one code object.
enum ReadError {
    Memory(MemError),
    BadString { addr: u64, state: u32 },
}

impl From<MemError> for ReadError {
    fn from(error: MemError) -> Self {
        Self::Memory(error)
    }
}

impl CodeObject {
    /// Reads the code object at `addr`: its fixed fields in one read, then
    /// the two strings and the location table.
    fn read(memory: &ProcessMemory, layout: &VersionLayout, addr: u64) -> Result<Self, ReadError> {
        let code = &layout.code;
        let first_lineno_offset = u64::from(layout.walk.code_firstlineno);
        let shape_offset = u64::from(layout.walk.code_shape);
        let header_end = (code.linetable + 8)
            .max(first_lineno_offset + 4)
            .max(shape_offset + 8);
        let header_len = usize::try_from(header_end).unwrap_or(0);
        let mut header = vec![0u8; header_len];
        memory.read_exact(addr, &mut header)?;
        let first_lineno = field::<4>(&header, first_lineno_offset).map_or(0, i32::from_le_bytes);
        let pointer = |offset| field::<8>(&header, offset).map_or(0, u64::from_le_bytes);
        let qualname = pointer(code.qualname);
        let filename = pointer(code.filename);
        let linetable = pointer(code.linetable);
        Ok(Self {
            first_lineno,
            fingerprint: code_fingerprint(
                first_lineno.cast_unsigned(),
                qualname,
                field::<8>(&header, shape_offset).map_or(0, u64::from_le_bytes),
            ),
            function: read_str(memory, &layout.unicode, qualname)?,
            file: display_file(read_str(memory, &layout.unicode, filename)?),
            linetable: read_bytes(memory, layout, linetable)?,
            format: code.format,
            lines: HashMap::new(),
        })
    }

    /// Whether this code object's fingerprint is the frame's.
    fn matches(&self, frame: &PyFrame) -> bool {
        self.fingerprint == frame.fingerprint
    }

    /// Accepts the code object only if it [`matches`](Self::matches) the
    /// frame.
    fn check(self, tgid: u32, frame: &PyFrame) -> Result<Self, ResolveError> {
        if self.matches(frame) {
            Ok(self)
        } else {
            Err(ResolveError::FingerprintMismatch {
                tgid,
                code_addr: frame.code_addr,
                expected: frame.fingerprint,
                found: self.fingerprint,
            })
        }
    }

    /// Line of the frame's instruction, memoised.
    fn line(&mut self, tgid: u32, frame: &PyFrame) -> Result<u32, ResolveError> {
        if let Some(&line) = self.lines.get(&frame.instr_index) {
            return Ok(line);
        }
        let line = self
            .decode_line(frame.instr_index)
            .map_err(|source| ResolveError::LineTable {
                tgid,
                code_addr: frame.code_addr,
                instr_index: frame.instr_index,
                source,
            })?
            .unwrap_or(0);
        self.lines.insert(frame.instr_index, line);
        Ok(line)
    }

    /// Line of `instr_index` in this code object's table, as its version
    /// encodes it.
    fn decode_line(&self, instr_index: i32) -> Result<Option<u32>, LineTableError> {
        let (table, first) = (&self.linetable, self.first_lineno);
        match self.format {
            LineFormat::Lnotab39 => lnotab::line_3_9(table, first, instr_index).map(Some),
            LineFormat::Linetable310 => lnotab::line_3_10(table, first, instr_index),
            LineFormat::Locations => linetable::line_for_index(table, first, instr_index),
        }
    }
}

/// The file name to show for `co_filename`: `<string>` for an empty one
/// (`compile(source, "", "exec")`), which would otherwise print as `(:2)`;
/// `<string>` is what `exec` and `compile` name code given no file.
fn display_file(file: String) -> String {
    if file.is_empty() {
        EMPTY_FILE_NAME.to_owned()
    } else {
        file
    }
}

/// [`display_file`] of an empty file name.
const EMPTY_FILE_NAME: &str = "<string>";

/// Decodes the compact str at `addr` (python-stacks.md §6): `kind` (bits
/// 2..5 of `state`) is the bytes per code point, 1 for ASCII/Latin-1, 2 for
/// UCS-2, 4 for UCS-4; the data follows the `PyASCIIObject` header for ASCII
/// strings and the `PyCompactUnicodeObject` header otherwise. Invalid code
/// points become U+FFFD.
fn read_str(
    memory: &ProcessMemory,
    unicode: &UnicodeLayout,
    addr: u64,
) -> Result<String, ReadError> {
    let length = memory.read_u64(addr.wrapping_add(unicode.length))?;
    let state = memory.read_u32(addr.wrapping_add(unicode.state))?;
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return Err(ReadError::BadString { addr, state });
    }
    let header_bytes = if ascii {
        unicode.ascii_size_bytes
    } else {
        unicode.compact_size_bytes
    };
    let data = addr.wrapping_add(header_bytes);
    let len_bytes = i64::try_from(length)
        .ok()
        .and_then(|length| length.checked_mul(i64::from(kind)))
        .unwrap_or(-1);
    let bytes = memory.read_capped("str", data, len_bytes, MAX_STRING_BYTES)?;
    Ok(decode_code_points(&bytes, kind))
}

/// Turns `bytes` of `kind`-byte little-endian code points into a String.
fn decode_code_points(bytes: &[u8], kind: u32) -> String {
    match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| {
                char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))).unwrap_or('\u{fffd}')
            })
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}')
            })
            .collect(),
    }
}

/// Reads the data of the bytes object at `addr` (`co_linetable`).
fn read_bytes(
    memory: &ProcessMemory,
    layout: &VersionLayout,
    addr: u64,
) -> Result<Vec<u8>, ReadError> {
    let size = memory.read_u64(addr.wrapping_add(layout.bytes.size))?;
    let len_bytes = i64::try_from(size).unwrap_or(-1);
    Ok(memory.read_capped(
        "line table",
        addr.wrapping_add(layout.bytes.data),
        len_bytes,
        MAX_TABLE_BYTES,
    )?)
}

#[cfg(test)]
mod tests;

/// A userspace replica of the kernel-side walk (python-stacks.md §5) over a
/// sleeping interpreter: checks the BPF offsets of `offsets::LAYOUTS`, the
/// TSS key of `probe` and the resolver end to end against what the
/// interpreter itself reports.
#[cfg(test)]
mod walk_tests;
