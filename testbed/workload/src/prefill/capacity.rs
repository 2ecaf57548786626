//! How `--capacity` holds a run to a smaller card: a ballast on a real GPU,
//! the stand-in driver's own capacity under `--simulate`.

use vramtrace_models::units::ByteUnit;

use crate::error::{Error, Result};

/// The name of the allocation that shrinks a real GPU to `--capacity`.
pub const BALLAST: &str = "capacity ballast";

/// How `--capacity` is enforced on this device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityPlan {
    /// `--capacity`, when given.
    pub requested: Option<usize>,
    /// Total device memory, when the device says.
    pub device_total: Option<usize>,
    /// Free device memory before the run, when the device says.
    pub device_free: Option<usize>,
    /// Bytes of the ballast to allocate first (0: none).
    pub ballast: usize,
    /// Something the user should know about how the capacity applies.
    pub note: Option<String>,
}

/// Decide how to hold the run to `requested` bytes, given the device's
/// `(free, total)` memory right after context creation. On a real GPU
/// (`ballast_allowed`) a ballast of `free - requested` leaves the run exactly
/// `requested` bytes, so the driver itself refuses the allocation that does
/// not fit; on the stand-in driver its own capacity (`VRAMTRACE_FAKE_CAPACITY`)
/// limits, and this only reports it. A capacity larger than the card is refused.
pub fn plan_capacity(
    requested: Option<usize>,
    ballast_allowed: bool,
    mem: Option<(usize, usize)>,
) -> Result<CapacityPlan> {
    let mut plan = CapacityPlan {
        requested,
        device_total: mem.map(|m| m.1),
        device_free: mem.map(|m| m.0),
        ballast: 0,
        note: None,
    };
    let Some(req) = requested else {
        return Ok(plan);
    };
    let gib = |b: usize| ByteUnit::GiB.format(b as f64, 2);
    if let Some((_, total)) = mem
        && req > total
    {
        return Err(Error::InvalidShape(format!(
            "--capacity {req} bytes ({}) is larger than the card ({total} bytes, {}); \
             give at most {total}",
            gib(req),
            gib(total)
        )));
    }
    match (ballast_allowed, mem) {
        (true, None) => {
            return Err(Error::Driver {
                call: "cuMemGetInfo_v2".into(),
                message: "the driver did not report free memory, which --capacity needs to size \
                          its ballast; run without --capacity"
                    .into(),
            });
        }
        (true, Some((free, _))) if free > req => plan.ballast = free - req,
        (true, Some((free, _))) => {
            plan.note = Some(format!(
                "the card has only {free} bytes ({}) free, not more than --capacity: no \
                 ballast, the card's own free memory limits",
                gib(free)
            ));
        }
        (false, Some((_, total))) if total != req => {
            plan.note = Some(format!(
                "on the stand-in driver its own capacity limits ({total} bytes, {}): set \
                 VRAMTRACE_FAKE_CAPACITY={req} to simulate a {} card",
                gib(total),
                gib(req)
            ));
        }
        (false, _) => {}
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_enforced_by_a_ballast_on_a_real_card_only() {
        let gib = 1usize << 30;
        let real = plan_capacity(Some(24 * gib), true, Some((139 * gib, 140 * gib))).unwrap();
        assert_eq!(real.ballast, 115 * gib);
        let sim = plan_capacity(Some(24 * gib), false, Some((24 * gib, 24 * gib))).unwrap();
        assert_eq!((sim.ballast, sim.note), (0, None));
        let other = plan_capacity(Some(16 * gib), false, Some((24 * gib, 24 * gib))).unwrap();
        assert!(other.note.unwrap().contains("VRAMTRACE_FAKE_CAPACITY="));
        let e = plan_capacity(Some(200 * gib), true, Some((139 * gib, 140 * gib))).unwrap_err();
        assert!(e.to_string().contains("larger than the card"), "{e}");
        let tight = plan_capacity(Some(24 * gib), true, Some((20 * gib, 140 * gib))).unwrap();
        assert_eq!(tight.ballast, 0);
        assert!(tight.note.is_some());
    }
}
