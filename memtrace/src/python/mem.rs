//! Reads a traced process's memory through /proc/PID/mem (`pread`): the
//! userspace half of stack resolution, used by `probe` (runtime state) and
//! `code` (code objects, strings, line tables).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use thiserror::Error;

/// The `N` bytes at `offset` of `bytes` (a struct read in one piece), if in
/// range.
pub(super) fn field<const N: usize>(bytes: &[u8], offset: u64) -> Option<[u8; N]> {
    let start = usize::try_from(offset).ok()?;
    bytes.get(start..start.checked_add(N)?)?.try_into().ok()
}

/// Longest str object memtrace decodes, in bytes of character data; larger
/// lengths are treated as garbage (py-spy uses the same cap).
pub const MAX_STRING_BYTES: u64 = 4096;
/// Longest line table (`co_linetable`) memtrace reads, in bytes.
pub const MAX_TABLE_BYTES: u64 = 64 * 1024;

/// A failed read of another process's memory.
#[derive(Debug, Error)]
pub enum MemError {
    /// /proc/PID/mem could not be opened.
    #[error(
        "cannot open `{path}`: {source} (is the process gone, or are CAP_SYS_PTRACE/root missing?)"
    )]
    Open {
        /// The file that failed to open.
        path: PathBuf,
        /// The error from open(2).
        #[source]
        source: io::Error,
    },
    /// A read failed or came back short (unmapped address, or the process
    /// exited).
    #[error("cannot read {len_bytes} bytes at {addr:#x} of process {tgid}: {source}")]
    Read {
        /// The process.
        tgid: u32,
        /// First address of the read.
        addr: u64,
        /// Bytes requested.
        len_bytes: usize,
        /// The error from pread(2).
        #[source]
        source: io::Error,
    },
    /// A length read from the target exceeded its cap.
    #[error("{what} of {len_bytes} bytes at {addr:#x} of process {tgid} exceeds the {max_bytes}-byte cap")]
    TooLong {
        /// What was read, e.g. "str" or "line table".
        what: &'static str,
        /// The process.
        tgid: u32,
        /// Address of the object.
        addr: u64,
        /// The length found there.
        len_bytes: i64,
        /// The cap.
        max_bytes: u64,
    },
}

/// An open /proc/PID/mem of one process.
#[derive(Debug)]
pub struct ProcessMemory {
    tgid: u32,
    file: File,
}

impl ProcessMemory {
    /// Opens /proc/`tgid`/mem for reading.
    ///
    /// # Errors
    /// [`MemError::Open`] when the process is gone or the caller may not
    /// ptrace it.
    pub fn open(tgid: u32) -> Result<Self, MemError> {
        // Through a live thread when the main thread alone has exited.
        let reader = crate::process::proc::reader_pid(tgid).unwrap_or(tgid);
        let path = PathBuf::from(format!("/proc/{reader}/mem"));
        let file = File::open(&path).map_err(|source| MemError::Open { path, source })?;
        Ok(Self { tgid, file })
    }

    /// The process this memory belongs to.
    #[must_use]
    pub fn tgid(&self) -> u32 {
        self.tgid
    }

    /// Fills `buf` from address `addr`.
    ///
    /// # Errors
    /// [`MemError::Read`] on a failed or short read.
    pub fn read_exact(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.file
            .read_exact_at(buf, addr)
            .map_err(|source| MemError::Read {
                tgid: self.tgid,
                addr,
                len_bytes: buf.len(),
                source,
            })
    }

    /// Reads `N` bytes at `addr`.
    ///
    /// # Errors
    /// As [`Self::read_exact`].
    pub fn read_array<const N: usize>(&self, addr: u64) -> Result<[u8; N], MemError> {
        let mut buf = [0u8; N];
        self.read_exact(addr, &mut buf)?;
        Ok(buf)
    }

    /// Reads a little-endian `u64` (a pointer or `Py_ssize_t`) at `addr`.
    ///
    /// # Errors
    /// As [`Self::read_exact`].
    pub fn read_u64(&self, addr: u64) -> Result<u64, MemError> {
        self.read_array(addr).map(u64::from_le_bytes)
    }

    /// Reads a little-endian `u32` at `addr`.
    ///
    /// # Errors
    /// As [`Self::read_exact`].
    pub fn read_u32(&self, addr: u64) -> Result<u32, MemError> {
        self.read_array(addr).map(u32::from_le_bytes)
    }

    /// Reads `len_bytes` bytes at `addr`, refusing more than `max_bytes`
    /// (`len_bytes` comes from the target and may be garbage).
    ///
    /// # Errors
    /// [`MemError::TooLong`] when `len_bytes` is negative or above
    /// `max_bytes`; otherwise as [`Self::read_exact`].
    pub fn read_capped(
        &self,
        what: &'static str,
        addr: u64,
        len_bytes: i64,
        max_bytes: u64,
    ) -> Result<Vec<u8>, MemError> {
        let len = u64::try_from(len_bytes)
            .ok()
            .filter(|&len| len <= max_bytes)
            .and_then(|len| usize::try_from(len).ok())
            .ok_or(MemError::TooLong {
                what,
                tgid: self.tgid,
                addr,
                len_bytes,
                max_bytes,
            })?;
        let mut buf = vec![0u8; len];
        self.read_exact(addr, &mut buf)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory() {
        let value: u64 = 0x1122_3344_5566_7788;
        let bytes = *b"hello memtrace";
        let mem = ProcessMemory::open(std::process::id()).unwrap();
        assert_eq!(
            mem.read_u64(std::ptr::addr_of!(value) as u64).unwrap(),
            value
        );
        assert_eq!(
            mem.read_u32(std::ptr::addr_of!(value) as u64).unwrap(),
            0x5566_7788
        );
        let got = mem
            .read_capped("test", bytes.as_ptr() as u64, 5, MAX_STRING_BYTES)
            .unwrap();
        assert_eq!(got, b"hello");
    }

    #[test]
    fn rejects_bad_lengths_and_addresses() {
        let mem = ProcessMemory::open(std::process::id()).unwrap();
        let bytes = [0u8; 8];
        let addr = bytes.as_ptr() as u64;
        assert!(matches!(
            mem.read_capped("str", addr, -1, MAX_STRING_BYTES),
            Err(MemError::TooLong { len_bytes: -1, .. })
        ));
        assert!(matches!(
            mem.read_capped("str", addr, 4097, MAX_STRING_BYTES),
            Err(MemError::TooLong { .. })
        ));
        assert!(matches!(
            mem.read_u64(0),
            Err(MemError::Read { addr: 0, .. })
        ));
    }

    #[test]
    fn missing_process_fails_to_open() {
        // PIDs are below 2^22 on Linux (pid_max limit), so this one never exists.
        assert!(matches!(
            ProcessMemory::open(u32::MAX - 1),
            Err(MemError::Open { .. })
        ));
    }
}
