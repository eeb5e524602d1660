//! Reads another process's memory for the census without pausing it:
//! scattered small reads (pool headers, chunk headers) go through
//! `process_vm_readv(2)` with up to [`IOVECS_PER_CALL`] remote iovecs a
//! call (census.md: ~0.7 us per iovec, half the time of one `pread` per
//! header), and every byte read is counted so a census can say what it
//! cost. [`Image`] is the same interface over captured bytes, for tests.

use std::io;

/// Remote iovecs per `process_vm_readv` call: the kernel's `UIO_MAXIOV`
/// is 1024 (census.md measured 45-52 ms per GiB of arenas at this size).
pub const IOVECS_PER_CALL: usize = 1024;

/// Memory the census reads: a live process or a captured image.
pub trait Memory {
    /// Fills `buf` from address `addr`; an error when any byte of it is not
    /// mapped (or the process is gone).
    ///
    /// # Errors
    /// The address range is not readable.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Reads `len` bytes at each of `addrs` into one buffer (`len` bytes
    /// per address, in order); `None` for an address whose bytes could not
    /// be read.
    fn gather(&mut self, addrs: &[u64], len: usize) -> Vec<Option<Vec<u8>>> {
        addrs
            .iter()
            .map(|&addr| {
                let mut buf = vec![0; len];
                self.read(addr, &mut buf).ok().map(|()| buf)
            })
            .collect()
    }

    /// Bytes read so far.
    fn bytes_read(&self) -> u64;
}

/// A little-endian `u64` at `offset` of `bytes` (0 past its end).
#[must_use]
pub fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    bytes
        .get(offset..offset + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// A little-endian `u32` at `offset` of `bytes` (0 past its end).
#[must_use]
pub fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    bytes
        .get(offset..offset + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
}

/// A live process, read with `process_vm_readv` (root or CAP_SYS_PTRACE).
#[derive(Debug)]
pub struct Process {
    pid: libc::pid_t,
    bytes_read: u64,
}

impl Process {
    /// The process `pid` (a thread of it that is alive).
    #[must_use]
    pub fn new(pid: u32) -> Self {
        Self {
            pid: pid as libc::pid_t,
            bytes_read: 0,
        }
    }

    /// One `process_vm_readv` of `remote` into `local`; returns the bytes
    /// read (it stops at the first iovec that fails).
    fn readv(&mut self, local: &mut [u8], remote: &[libc::iovec]) -> io::Result<usize> {
        let local_iov = libc::iovec {
            iov_base: local.as_mut_ptr().cast(),
            iov_len: local.len(),
        };
        // SAFETY: `local_iov` covers `local`, which outlives the call; the
        // remote iovecs are only addresses in the other process.
        let got = unsafe {
            libc::process_vm_readv(
                self.pid,
                &local_iov,
                1,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        self.bytes_read += got as u64;
        Ok(got as usize)
    }
}

impl Memory for Process {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let remote = [libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        }];
        let got = self.readv(buf, &remote)?;
        if got == buf.len() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"))
        }
    }

    fn gather(&mut self, addrs: &[u64], len: usize) -> Vec<Option<Vec<u8>>> {
        let mut out = Vec::with_capacity(addrs.len());
        let mut buf = vec![0u8; IOVECS_PER_CALL * len];
        while out.len() < addrs.len() {
            let rest = &addrs[out.len()..];
            let batch = &rest[..rest.len().min(IOVECS_PER_CALL)];
            let remote: Vec<libc::iovec> = batch
                .iter()
                .map(|&addr| libc::iovec {
                    iov_base: addr as *mut libc::c_void,
                    iov_len: len,
                })
                .collect();
            let local = &mut buf[..batch.len() * len];
            // The call stops at the first iovec that fails: keep the whole
            // ones read, mark the failing one unread, and go on after it.
            let whole = self.readv(local, &remote).map_or(0, |got| got / len);
            out.extend(local.chunks(len).take(whole).map(|c| Some(c.to_vec())));
            if whole < batch.len() {
                out.push(None);
            }
        }
        out
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

/// Captured memory: segments of bytes at their addresses (a test's
/// fixture, built from the documented layouts or read once from a real
/// process).
#[derive(Clone, Debug, Default)]
pub struct Image {
    segments: Vec<(u64, Vec<u8>)>,
    bytes_read: u64,
}

impl Image {
    /// An image with no memory.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `bytes` at `addr` (segments must not overlap).
    pub fn map(&mut self, addr: u64, bytes: Vec<u8>) {
        self.segments.push((addr, bytes));
        self.segments.sort_by_key(|(start, _)| *start);
    }

    /// Writes `bytes` at `addr`, inside a mapped segment.
    ///
    /// # Panics
    /// When no segment holds the whole range (a fixture's mistake).
    pub fn write(&mut self, addr: u64, bytes: &[u8]) {
        let (start, segment) = self
            .segments
            .iter_mut()
            .find(|(start, seg)| {
                *start <= addr && addr + bytes.len() as u64 <= start + seg.len() as u64
            })
            .expect("write inside a mapped segment");
        let offset = (addr - *start) as usize;
        segment[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
}

impl Memory for Image {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = addr
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let (start, segment) = self
            .segments
            .iter()
            .find(|(start, seg)| *start <= addr && end <= start + seg.len() as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let offset = (addr - start) as usize;
        buf.copy_from_slice(&segment[offset..offset + buf.len()]);
        self.bytes_read += buf.len() as u64;
        Ok(())
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_gathers_own_memory() {
        let words: Vec<u64> = (0..3000).map(|i| i * 7).collect();
        let base = words.as_ptr() as u64;
        let mut me = Process::new(std::process::id());
        let addrs: Vec<u64> = (0..3000).step_by(3).map(|i| base + i * 8).collect();
        let got = me.gather(&addrs, 8);
        assert_eq!(got.len(), 1000);
        for (i, bytes) in got.iter().enumerate() {
            assert_eq!(u64_at(bytes.as_ref().unwrap(), 0), i as u64 * 21);
        }
        assert_eq!(me.bytes_read(), 8000);
        // An unmapped address in a batch fails alone.
        let got = me.gather(&[base, 8, base + 8], 8);
        assert!(got[0].is_some() && got[1].is_none() && got[2].is_some());
        let mut buf = [0u8; 8];
        assert!(me.read(16, &mut buf).is_err());
    }

    #[test]
    fn an_image_reads_inside_its_segments_only() {
        let mut image = Image::new();
        image.map(0x1000, vec![0; 64]);
        image.write(0x1008, &42u64.to_le_bytes());
        let mut buf = [0u8; 8];
        image.read(0x1008, &mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), 42);
        assert!(image.read(0x1040 - 4, &mut buf).is_err());
    }
}
