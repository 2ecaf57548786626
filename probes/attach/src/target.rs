//! What `/proc` says about the process to attach to: its memory map, who owns it, whether it
//! may be attached at all. Nothing here stops or changes the target.

use std::path::{Path, PathBuf};

use crate::{AttachError, Ineligible};

/// `CAP_SYS_PTRACE`'s bit in the capability sets (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: String,
    /// Offset in the file.
    pub offset: u64,
    /// The file, when the mapping is of one.
    pub path: Option<PathBuf>,
}

/// Parses the text of `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(6, ' ');
            let range = f.next()?;
            let perms = f.next()?.to_string();
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f
                .next()
                .map(str::trim)
                .filter(|p| p.starts_with('/'))
                .map(PathBuf::from);
            let (a, b) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                perms,
                offset,
                path,
            })
        })
        .collect()
}

/// The loaded object whose file name starts with `prefix` (`libcuda.so`): its path and the
/// address its file offset 0 is mapped at.
pub fn find_object(maps: &[Mapping], prefix: &str) -> Option<(PathBuf, u64)> {
    maps.iter()
        .filter(|m| m.offset == 0)
        .find(|m| {
            m.path
                .as_ref()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|m| (m.path.clone().unwrap_or_default(), m.start))
}

/// The address range every mapping of `path` covers.
pub fn object_range(maps: &[Mapping], path: &Path) -> Option<(u64, u64)> {
    let mine = maps.iter().filter(|m| m.path.as_deref() == Some(path));
    let lo = mine.clone().map(|m| m.start).min()?;
    let hi = mine.map(|m| m.end).max()?;
    Some((lo, hi))
}

/// Page-aligned addresses of free room for `size` bytes whose every byte is within ±1.5 GiB
/// of every byte of `[lo, hi)` (a `jmp rel32` or a RIP-relative operand reaches them),
/// nearest first.
pub fn free_room_near(maps: &[Mapping], lo: u64, hi: u64, size: u64) -> Vec<u64> {
    const REACH: u64 = 3 << 29;
    let mut spans: Vec<(u64, u64)> = maps.iter().map(|m| (m.start, m.end)).collect();
    spans.sort();
    let mut out = Vec::new();
    // Just above each mapping and just below each, where the neighbour leaves room.
    for w in spans.windows(2) {
        let (gap_lo, gap_hi) = (w[0].1, w[1].0);
        if gap_hi <= gap_lo || gap_hi - gap_lo < size + 2 * 4096 {
            continue;
        }
        for cand in [gap_lo + 4096, gap_hi - 4096 - size] {
            let far = cand.abs_diff(hi).max((cand + size).abs_diff(lo));
            if far < REACH && cand >= 0x10000 {
                out.push(cand);
            }
        }
    }
    out.sort_by_key(|&c| c.abs_diff(lo));
    out.dedup();
    out
}

/// The facts about a process that decide whether it may be attached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetFacts {
    /// Real, effective, saved and filesystem user ids.
    pub uids: [u32; 4],
    /// Real, effective, saved and filesystem group ids.
    pub gids: [u32; 4],
    /// `TracerPid` (0: not traced).
    pub tracer: u32,
    /// The state letter (`S`, `R`, `Z`, ...).
    pub state: char,
    /// Its executable has the set-user-ID or set-group-ID bit.
    pub setid_exe: bool,
}

/// The facts about `vramtrace` itself that decide it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfFacts {
    /// Effective user id.
    pub euid: u32,
    /// Effective group id.
    pub egid: u32,
    /// `CAP_SYS_PTRACE` is in the effective set.
    pub cap_sys_ptrace: bool,
    /// `/proc/sys/kernel/yama/ptrace_scope`, if Yama is there.
    pub ptrace_scope: Option<u32>,
    /// The target is a descendant of this process.
    pub is_ancestor: bool,
}

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

fn four(v: Option<&str>) -> [u32; 4] {
    let mut out = [u32::MAX; 4];
    for (o, w) in out.iter_mut().zip(
        v.unwrap_or("")
            .split_whitespace()
            .filter_map(|x| x.parse().ok()),
    ) {
        *o = w;
    }
    out
}

/// Parses `/proc/PID/status` into the facts that matter here.
pub fn parse_status(status: &str) -> TargetFacts {
    TargetFacts {
        uids: four(status_field(status, "Uid:")),
        gids: four(status_field(status, "Gid:")),
        tracer: status_field(status, "TracerPid:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        state: status_field(status, "State:")
            .and_then(|v| v.chars().next())
            .unwrap_or('?'),
        setid_exe: false,
    }
}

/// Whether `me` may attach to `target` (pid `pid`), as the kernel would decide it, said
/// before anything is touched: `Err` is [`AttachError::Refused`] with the reason (an
/// [`Ineligible`]) and what to do.
pub fn may_attach(pid: i32, target: &TargetFacts, me: &SelfFacts) -> Result<(), AttachError> {
    eligible(target, me).map_err(|why| AttachError::refused(pid, why))
}

/// [`may_attach`]'s decision.
fn eligible(target: &TargetFacts, me: &SelfFacts) -> Result<(), Ineligible> {
    if target.state == 'Z' || target.state == 'X' {
        return Err(Ineligible::Exited);
    }
    if target.setid_exe || target.uids[0] != target.uids[1] || target.gids[0] != target.gids[1] {
        return Err(Ineligible::Privileged);
    }
    if target.tracer != 0 {
        return Err(Ineligible::Traced { by: target.tracer });
    }
    let same_user =
        target.uids.iter().all(|&u| u == me.euid) && target.gids.iter().all(|&g| g == me.egid);
    if !same_user && !me.cap_sys_ptrace {
        return Err(Ineligible::OtherUser {
            target: target.uids[1],
            ours: me.euid,
        });
    }
    match me.ptrace_scope {
        Some(scope @ 3) => Err(Ineligible::PtraceScope { scope }),
        Some(scope @ 2) if !me.cap_sys_ptrace => Err(Ineligible::PtraceScope { scope }),
        Some(scope @ 1) if !me.cap_sys_ptrace && !me.is_ancestor => {
            Err(Ineligible::PtraceScope { scope })
        }
        _ => Ok(()),
    }
}

/// Reads the facts about process `pid` from `/proc`; a dead pid is a refusal.
pub fn target_facts(pid: i32) -> Result<TargetFacts, AttachError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| AttachError::refused(pid, Ineligible::NoSuchProcess))?;
    let mut facts = parse_status(&status);
    // Only the owner (or root) may read the link; without it the id check above still holds.
    if let Ok(meta) = std::fs::metadata(format!("/proc/{pid}/exe")) {
        use std::os::unix::fs::PermissionsExt;
        facts.setid_exe = meta.permissions().mode() & 0o6000 != 0;
    }
    Ok(facts)
}

/// Reads the facts about this process.
pub fn self_facts(pid: i32) -> SelfFacts {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status_field(&status, "CapEff:")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .unwrap_or(0);
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    SelfFacts {
        // Safety: no preconditions.
        euid: unsafe { libc::geteuid() },
        // Safety: no preconditions.
        egid: unsafe { libc::getegid() },
        cap_sys_ptrace: cap_eff & (1 << CAP_SYS_PTRACE) != 0,
        ptrace_scope: scope,
        is_ancestor: is_ancestor(pid),
    }
}

/// True when this process is an ancestor of `pid`.
fn is_ancestor(pid: i32) -> bool {
    let me = std::process::id() as i32;
    let mut p = pid;
    for _ in 0..64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            return false;
        };
        // The command name may hold spaces and parentheses: fields start after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let ppid: i32 = rest
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if ppid == me {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        p = ppid;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> SelfFacts {
        SelfFacts {
            euid: 1000,
            egid: 1000,
            cap_sys_ptrace: false,
            ptrace_scope: Some(0),
            is_ancestor: false,
        }
    }

    fn target() -> TargetFacts {
        TargetFacts {
            uids: [1000; 4],
            gids: [1000; 4],
            tracer: 0,
            state: 'S',
            setid_exe: false,
        }
    }

    fn reason(r: Result<(), AttachError>) -> String {
        let e = r.unwrap_err();
        assert!(
            matches!(&e, AttachError::Refused { pid: 7, cause } if matches!(**cause, AttachError::NotEligible(_))),
            "{e:?}"
        );
        e.to_string()
    }

    #[test]
    fn maps_lines_are_parsed() {
        let m = parse_maps(
            "7f0000000000-7f0000001000 r-xp 00001000 08:01 42 /usr/lib/libcuda.so.1 (deleted)\n\
             7ffd0000-7ffe0000 rw-p 00000000 00:00 0 [stack]\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].start, 0x7f0000000000);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].perms, "r-xp");
        assert_eq!(
            m[0].path.as_deref(),
            Some(Path::new("/usr/lib/libcuda.so.1 (deleted)"))
        );
        assert_eq!(m[1].path, None);
    }

    #[test]
    fn room_is_found_within_reach_only() {
        let maps = parse_maps(
            "10000000-10100000 r-xp 00000000 08:01 1 /lib/libcuda.so.1\n\
             10100000-10200000 rw-p 00100000 08:01 1 /lib/libcuda.so.1\n\
             10300000-10400000 rw-p 00000000 00:00 0\n\
             7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n",
        );
        let room = free_room_near(&maps, 0x10000000, 0x10200000, 4096);
        assert_eq!(
            room[0], 0x10201000,
            "just above the driver, one guard page away"
        );
        assert!(room.iter().all(|&c| c < 0x7f0000000000));
    }

    #[test]
    fn each_refusal_says_why() {
        assert!(may_attach(7, &target(), &me()).is_ok());
        let other_user = TargetFacts {
            uids: [0; 4],
            ..target()
        };
        assert!(reason(may_attach(7, &other_user, &me())).contains("runs as user 0"));
        assert_eq!(
            eligible(&other_user, &me()),
            Err(Ineligible::OtherUser {
                target: 0,
                ours: 1000
            })
        );
        let root = SelfFacts {
            cap_sys_ptrace: true,
            ..me()
        };
        assert!(may_attach(7, &other_user, &root).is_ok());
        let setuid = TargetFacts {
            uids: [1000, 0, 0, 0],
            ..target()
        };
        assert!(reason(may_attach(7, &setuid, &root)).contains("set-user-ID"));
        let setid_file = TargetFacts {
            setid_exe: true,
            ..target()
        };
        assert!(reason(may_attach(7, &setid_file, &root)).contains("set-user-ID"));
        let traced = TargetFacts {
            tracer: 99,
            ..target()
        };
        assert!(reason(may_attach(7, &traced, &me())).contains("already traced by process 99"));
        let zombie = TargetFacts {
            state: 'Z',
            ..target()
        };
        assert!(reason(may_attach(7, &zombie, &me())).contains("exited"));
        for (scope, cap, ancestor, ok) in [
            (1, false, false, false),
            (1, false, true, true),
            (1, true, false, true),
            (2, false, true, false),
            (2, true, false, true),
            (3, true, true, false),
        ] {
            let who = SelfFacts {
                ptrace_scope: Some(scope),
                cap_sys_ptrace: cap,
                is_ancestor: ancestor,
                ..me()
            };
            let r = may_attach(7, &target(), &who);
            assert_eq!(r.is_ok(), ok, "scope {scope} cap {cap} ancestor {ancestor}");
            if let Err(e) = r {
                assert!(e.to_string().contains(&format!("ptrace_scope is {scope}")));
                assert_eq!(
                    eligible(&target(), &who),
                    Err(Ineligible::PtraceScope { scope })
                );
            }
        }
    }
}
