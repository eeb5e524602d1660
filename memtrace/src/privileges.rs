//! Before the first step of the data flow: what this process may do (its
//! effective uid and capabilities, via the `caps` crate), so that every
//! refusal (loading programs in `bpf`, reading tracefs, reading another
//! process's memory in `process`) names the capability that is missing.

use caps::{CapSet, Capability, CapsHashSet};

/// The effective uid and capability set of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Privileges {
    /// Effective uid.
    pub uid: u32,
    /// Effective capabilities.
    pub effective: CapsHashSet,
}

impl Privileges {
    /// This process's privileges now (an unreadable set counts as empty).
    #[must_use]
    pub fn current() -> Self {
        Self {
            uid: nix::unistd::geteuid().as_raw(),
            effective: caps::read(None, CapSet::Effective).unwrap_or_default(),
        }
    }

    /// Privileges with exactly `caps` for `uid` (tests, messages).
    #[must_use]
    pub fn with(uid: u32, caps: &[Capability]) -> Self {
        Self {
            uid,
            effective: caps.iter().copied().collect(),
        }
    }

    /// Whether `cap` is in the effective set.
    #[must_use]
    pub fn has(&self, cap: Capability) -> bool {
        self.effective.contains(&cap)
    }

    /// What loading and attaching the tracing programs needs and is
    /// missing: `CAP_BPF` (maps, programs) and `CAP_PERFMON` (tracing
    /// programs, `bpf_probe_read_user`, perf events for tracepoints and
    /// uprobes); `CAP_SYS_ADMIN` stands in for both, as in the kernel's
    /// `bpf_capable()` and `perfmon_capable()`. Empty when nothing is.
    #[must_use]
    pub fn missing_for_tracing(&self) -> Vec<Capability> {
        if self.has(Capability::CAP_SYS_ADMIN) {
            return Vec::new();
        }
        [Capability::CAP_BPF, Capability::CAP_PERFMON]
            .into_iter()
            .filter(|&cap| !self.has(cap))
            .collect()
    }

    /// Which of `caps` are in the effective set, by name in the order
    /// given, e.g. `CAP_PERFMON`, or `none`.
    #[must_use]
    pub fn held_names(&self, caps: &[Capability]) -> String {
        let held: Vec<String> = caps
            .iter()
            .filter(|&&cap| self.has(cap))
            .map(ToString::to_string)
            .collect();
        if held.is_empty() {
            "none".to_owned()
        } else {
            held.join(", ")
        }
    }
}

/// `CAP_A and CAP_B` for a list of capabilities.
#[must_use]
pub fn names(caps: &[Capability]) -> String {
    caps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_admin_stands_in_for_bpf_and_perfmon() {
        let admin = Privileges::with(1000, &[Capability::CAP_SYS_ADMIN]);
        assert!(admin.missing_for_tracing().is_empty());
        let both = Privileges::with(1000, &[Capability::CAP_BPF, Capability::CAP_PERFMON]);
        assert!(both.missing_for_tracing().is_empty());
    }

    #[test]
    fn missing_capabilities_are_listed() {
        let none = Privileges::with(0, &[]);
        assert_eq!(
            names(&none.missing_for_tracing()),
            "CAP_BPF and CAP_PERFMON"
        );
        let bpf_only = Privileges::with(0, &[Capability::CAP_BPF]);
        assert_eq!(names(&bpf_only.missing_for_tracing()), "CAP_PERFMON");
        let tracing = [Capability::CAP_BPF, Capability::CAP_PERFMON];
        assert_eq!(bpf_only.held_names(&tracing), "CAP_BPF");
        assert_eq!(none.held_names(&tracing), "none");
    }

    #[test]
    fn reads_this_process() {
        let me = Privileges::current();
        assert_eq!(me.uid, nix::unistd::geteuid().as_raw());
        // The effective set is a subset of the permitted one.
        let permitted = caps::read(None, CapSet::Permitted).unwrap();
        assert!(me.effective.is_subset(&permitted));
    }
}
