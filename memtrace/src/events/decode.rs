//! Step 2 of the data flow: one ring-buffer record's bytes → a typed
//! [`Record`]. Lengths are checked before any read; nothing here panics on
//! bad input.

use memtrace_common::{
    AddressOp, AddressRecord, AllocCall, AllocRecord, ExecRecord, ExitBeginReason, ExitBeginRecord,
    ExitRecord, ForkRecord, FreeRecord, MemoryEvent, MemoryRecord, NativeStackRecord, RecordHeader,
    RecordKind, MAX_FRAMES, NATIVE_STACK_BYTES,
};
use thiserror::Error;

/// A decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A traced process forked a new process.
    Fork(ForkRecord),
    /// A traced process's execve replaced its image.
    Exec(ExecRecord),
    /// A traced process began to exit (finalization or `exit_group`).
    ExitBegin(ExitBeginRecord),
    /// A traced process exited (its last thread).
    Exit(ExitRecord),
    /// A sampled memory event with its Python stack (boxed: 1,112 bytes).
    Memory(Box<MemoryRecord>),
    /// An exact release or move of address space.
    Address(AddressRecord),
    /// A sampled heap allocation with its Python stack (allocator mode;
    /// boxed: 1,088 bytes).
    Alloc(Box<AllocRecord>),
    /// A sampled heap block was freed (allocator mode).
    Free(FreeRecord),
    /// A thread's user registers and stack at a sampled allocation or fault,
    /// sent right before its [`Record::Alloc`] or [`Record::Memory`]
    /// (boxed: 16 KiB).
    NativeStack(Box<NativeStackRecord>),
}

/// Why a record could not be decoded. The record is skipped and counted.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than a record header.
    #[error("record of {len_bytes} bytes is shorter than its {header_bytes}-byte header")]
    ShortHeader {
        /// Bytes received.
        len_bytes: usize,
        /// Bytes a header needs.
        header_bytes: usize,
    },
    /// The header's kind is not one this build knows.
    #[error("unknown record kind `{kind}`")]
    UnknownKind {
        /// The tag found.
        kind: u32,
    },
    /// Fewer bytes than the record kind needs.
    #[error("truncated {kind:?} record: {len_bytes} bytes, need {need_bytes}")]
    Truncated {
        /// The record kind.
        kind: RecordKind,
        /// Bytes received.
        len_bytes: usize,
        /// Bytes the kind needs.
        need_bytes: usize,
    },
    /// A memory record with an event value this build does not know.
    #[error("unknown memory event `{event}`")]
    UnknownMemoryEvent {
        /// The value found.
        event: u32,
    },
    /// An exit-begin record with a reason this build does not know.
    #[error("unknown exit-begin reason `{reason}`")]
    UnknownExitBeginReason {
        /// The value found.
        reason: u32,
    },
    /// An address record with an operation this build does not know.
    #[error("unknown address operation `{op}`")]
    UnknownAddressOp {
        /// The value found.
        op: u32,
    },
    /// An allocation record with a call this build does not know.
    #[error("unknown allocator call `{call}`")]
    UnknownAllocCall {
        /// The value found.
        call: u32,
    },
    /// A native stack record claiming more stack bytes than it holds.
    #[error(
        "native stack record claims {len_bytes} stack bytes, at most {NATIVE_STACK_BYTES} fit"
    )]
    StackTooLong {
        /// The length found.
        len_bytes: u32,
    },
    /// A memory or allocation record claiming more frames than it can hold.
    #[error("memory record claims {frame_count} frames, at most {MAX_FRAMES} fit")]
    TooManyFrames {
        /// The count found.
        frame_count: u32,
    },
}

/// Decodes one record.
///
/// # Errors
/// [`DecodeError`] when `bytes` is shorter than the header or than its
/// kind's record, when the kind, memory event, exit-begin reason or address
/// operation or allocator call is unknown, when a memory or allocation
/// record's `frame_count` exceeds [`MAX_FRAMES`], or when a native stack
/// record's `stack_len_bytes` exceeds [`NATIVE_STACK_BYTES`].
pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    let header: RecordHeader = read(bytes).ok_or(DecodeError::ShortHeader {
        len_bytes: bytes.len(),
        header_bytes: size_of::<RecordHeader>(),
    })?;
    let kind =
        RecordKind::try_from(header.kind).map_err(|kind| DecodeError::UnknownKind { kind })?;
    match kind {
        RecordKind::Fork => read_kind(bytes, kind).map(Record::Fork),
        RecordKind::Exec => read_kind(bytes, kind).map(Record::Exec),
        RecordKind::ExitBegin => decode_exit_begin(bytes).map(Record::ExitBegin),
        RecordKind::Exit => read_kind(bytes, kind).map(Record::Exit),
        RecordKind::Memory => decode_memory(bytes).map(Record::Memory),
        RecordKind::Address => decode_address(bytes).map(Record::Address),
        RecordKind::Alloc => decode_alloc(bytes).map(Record::Alloc),
        RecordKind::Free => read_kind(bytes, kind).map(Record::Free),
        RecordKind::NativeStack => decode_native_stack(bytes).map(Record::NativeStack),
    }
}

fn decode_native_stack(bytes: &[u8]) -> Result<Box<NativeStackRecord>, DecodeError> {
    let record: NativeStackRecord = read_kind(bytes, RecordKind::NativeStack)?;
    if record.stack_len_bytes as usize > NATIVE_STACK_BYTES {
        return Err(DecodeError::StackTooLong {
            len_bytes: record.stack_len_bytes,
        });
    }
    Ok(Box::new(record))
}

fn decode_alloc(bytes: &[u8]) -> Result<Box<AllocRecord>, DecodeError> {
    let record: AllocRecord = read_kind(bytes, RecordKind::Alloc)?;
    AllocCall::try_from(record.call).map_err(|call| DecodeError::UnknownAllocCall { call })?;
    if record.frame_count as usize > MAX_FRAMES {
        return Err(DecodeError::TooManyFrames {
            frame_count: record.frame_count,
        });
    }
    Ok(Box::new(record))
}

fn decode_exit_begin(bytes: &[u8]) -> Result<ExitBeginRecord, DecodeError> {
    let record: ExitBeginRecord = read_kind(bytes, RecordKind::ExitBegin)?;
    ExitBeginReason::try_from(record.reason)
        .map_err(|reason| DecodeError::UnknownExitBeginReason { reason })?;
    Ok(record)
}

fn decode_address(bytes: &[u8]) -> Result<AddressRecord, DecodeError> {
    let record: AddressRecord = read_kind(bytes, RecordKind::Address)?;
    AddressOp::try_from(record.op).map_err(|op| DecodeError::UnknownAddressOp { op })?;
    Ok(record)
}

fn decode_memory(bytes: &[u8]) -> Result<Box<MemoryRecord>, DecodeError> {
    let record: MemoryRecord = read_kind(bytes, RecordKind::Memory)?;
    MemoryEvent::try_from(record.event)
        .map_err(|event| DecodeError::UnknownMemoryEvent { event })?;
    if record.frame_count as usize > MAX_FRAMES {
        return Err(DecodeError::TooManyFrames {
            frame_count: record.frame_count,
        });
    }
    Ok(Box::new(record))
}

fn read_kind<T: Copy>(bytes: &[u8], kind: RecordKind) -> Result<T, DecodeError> {
    read(bytes).ok_or(DecodeError::Truncated {
        kind,
        len_bytes: bytes.len(),
        need_bytes: size_of::<T>(),
    })
}

/// Reads a `T` from the start of `bytes` if it is long enough.
///
/// Only used with the `#[repr(C)]` integer-only records of
/// `memtrace_common`, for which every bit pattern is valid.
fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= size_of::<T>()).then(|| {
        // SAFETY: the length was checked above; `read_unaligned` copes with
        // any alignment; T is a plain-old-data record (integers only).
        unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
    })
}

#[cfg(test)]
mod tests {
    use memtrace_common::PyFrame;

    use super::*;

    fn bytes_of<T>(value: &T) -> Vec<u8> {
        // SAFETY: test records are plain-old-data without padding.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    fn header(kind: RecordKind) -> RecordHeader {
        RecordHeader {
            kind: kind as u32,
            tgid: 42,
            tid: 43,
            _pad: 0,
            ts_ns: 1_000,
        }
    }

    fn memory_record(frame_count: u32) -> MemoryRecord {
        let mut frames = [PyFrame::default(); MAX_FRAMES];
        frames[0] = PyFrame {
            code_addr: 0x7f00_0000_1000,
            instr_index: 12,
            fingerprint: 7,
        };
        MemoryRecord {
            header: header(RecordKind::Memory),
            event: MemoryEvent::AnonGrowth as u32,
            stack_status: 0,
            addr: 0x5000,
            len_bytes: 4096,
            weight_bytes: 524_288,
            native_ip: 0x40_1000,
            flags: 0,
            rss_bytes: 1 << 30,
            frame_count,
            _pad: 0,
            frames,
        }
    }

    #[test]
    fn decodes_fork() {
        let fork = ForkRecord {
            header: header(RecordKind::Fork),
            child_tgid: 99,
            shares_parent_mm: 0,
            child_start_boottime_ns: 123,
            child_rss_bytes: [1, 2, 3, 4],
        };
        assert_eq!(decode(&bytes_of(&fork)), Ok(Record::Fork(fork)));
    }

    fn counters() -> memtrace_common::ProcessCounters {
        memtrace_common::ProcessCounters {
            anon_growth_bytes: 4096,
            rss_known: 0b1111,
            ..Default::default()
        }
    }

    #[test]
    fn decodes_exec_exit_begin_and_exit() {
        let exec = ExecRecord {
            header: header(RecordKind::Exec),
            counters: counters(),
        };
        let begin = ExitBeginRecord {
            header: header(RecordKind::ExitBegin),
            reason: ExitBeginReason::PythonFinalize as u32,
            _pad: 0,
            counters: counters(),
        };
        let exit = ExitRecord {
            header: header(RecordKind::Exit),
            exit_code: 3 << 8,
            mm_released: 0,
            oom_victim: 1,
            _pad: 0,
            counters: counters(),
        };
        assert_eq!(decode(&bytes_of(&exec)), Ok(Record::Exec(exec)));
        assert_eq!(decode(&bytes_of(&begin)), Ok(Record::ExitBegin(begin)));
        assert_eq!(decode(&bytes_of(&exit)), Ok(Record::Exit(exit)));
    }

    #[test]
    fn decodes_address_and_rejects_unknown_operations() {
        let mut record = AddressRecord {
            header: header(RecordKind::Address),
            op: AddressOp::Mremap as u32,
            _pad: 0,
            addr: 0x1000,
            len_bytes: 0x2000,
            new_addr: 0x9000,
            new_len_bytes: 0x1000,
            rss_bytes: 77,
        };
        assert_eq!(decode(&bytes_of(&record)), Ok(Record::Address(record)));
        record.op = 99;
        assert_eq!(
            decode(&bytes_of(&record)),
            Err(DecodeError::UnknownAddressOp { op: 99 })
        );
        let begin = ExitBeginRecord {
            header: header(RecordKind::ExitBegin),
            reason: 9,
            _pad: 0,
            counters: counters(),
        };
        assert_eq!(
            decode(&bytes_of(&begin)),
            Err(DecodeError::UnknownExitBeginReason { reason: 9 })
        );
    }

    #[test]
    fn decodes_memory_from_unaligned_bytes() {
        let record = memory_record(1);
        let mut buf = vec![0u8];
        buf.extend(bytes_of(&record));
        assert_eq!(decode(&buf[1..]), Ok(Record::Memory(Box::new(record))));
    }

    fn alloc_record(call: u32, frame_count: u32) -> AllocRecord {
        AllocRecord {
            header: header(RecordKind::Alloc),
            call,
            stack_status: 0,
            addr: 0x7f00_0000_2000,
            size_bytes: 417,
            native_ip: 0x40_2000,
            flags: 0,
            frame_count,
            frames: [PyFrame::default(); MAX_FRAMES],
        }
    }

    #[test]
    fn decodes_alloc_and_free_and_checks_them() {
        let alloc = alloc_record(AllocCall::Realloc as u32, 3);
        assert_eq!(
            decode(&bytes_of(&alloc)),
            Ok(Record::Alloc(Box::new(alloc)))
        );
        let unknown = alloc_record(99, 0);
        assert_eq!(
            decode(&bytes_of(&unknown)),
            Err(DecodeError::UnknownAllocCall { call: 99 })
        );
        let too_many = alloc_record(AllocCall::Malloc as u32, MAX_FRAMES as u32 + 1);
        assert!(matches!(
            decode(&bytes_of(&too_many)),
            Err(DecodeError::TooManyFrames { .. })
        ));
        let free = FreeRecord {
            header: header(RecordKind::Free),
            addr: 0x7f00_0000_2000,
            size_bytes: 417,
        };
        let bytes = bytes_of(&free);
        assert_eq!(decode(&bytes), Ok(Record::Free(free)));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn decodes_native_stack_and_checks_its_length() {
        let mut record = Box::new(NativeStackRecord {
            header: header(RecordKind::NativeStack),
            ip: 0x40_2000,
            sp: 0x7ffe_0000_1010,
            bp: 0,
            stack_start: 0x7ffe_0000_1000,
            stack_len_bytes: 2048,
            _pad: 0,
            stack: [7; NATIVE_STACK_BYTES],
        });
        let bytes = bytes_of(&*record);
        assert_eq!(decode(&bytes), Ok(Record::NativeStack(record.clone())));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated { .. })
        ));
        record.stack_len_bytes = NATIVE_STACK_BYTES as u32 + 1;
        assert_eq!(
            decode(&bytes_of(&*record)),
            Err(DecodeError::StackTooLong {
                len_bytes: NATIVE_STACK_BYTES as u32 + 1
            })
        );
    }

    #[test]
    fn rejects_short_header() {
        assert_eq!(
            decode(&[1, 0, 0]),
            Err(DecodeError::ShortHeader {
                len_bytes: 3,
                header_bytes: 24
            })
        );
    }

    #[test]
    fn rejects_unknown_kind() {
        let mut h = header(RecordKind::Exit);
        h.kind = 77;
        assert_eq!(
            decode(&bytes_of(&h)),
            Err(DecodeError::UnknownKind { kind: 77 })
        );
    }

    #[test]
    fn rejects_truncated_memory_record() {
        let bytes = bytes_of(&memory_record(1));
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated {
                kind: RecordKind::Memory,
                len_bytes: bytes.len() - 1,
                need_bytes: bytes.len()
            })
        );
    }

    #[test]
    fn rejects_truncated_fork_record() {
        let fork = ForkRecord {
            header: header(RecordKind::Fork),
            child_tgid: 1,
            ..ForkRecord::default()
        };
        let bytes = bytes_of(&fork);
        assert!(matches!(
            decode(&bytes[..24]),
            Err(DecodeError::Truncated {
                kind: RecordKind::Fork,
                ..
            })
        ));
    }

    #[test]
    fn rejects_unknown_memory_event() {
        let mut record = memory_record(1);
        record.event = 200;
        assert_eq!(
            decode(&bytes_of(&record)),
            Err(DecodeError::UnknownMemoryEvent { event: 200 })
        );
    }

    #[test]
    fn rejects_too_many_frames() {
        let record = memory_record(MAX_FRAMES as u32 + 1);
        assert_eq!(
            decode(&bytes_of(&record)),
            Err(DecodeError::TooManyFrames {
                frame_count: MAX_FRAMES as u32 + 1
            })
        );
    }
}
