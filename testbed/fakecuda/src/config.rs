//! The stand-in's configuration: device count, per-device capacity and name,
//! read from the environment once, on the first `cuInit`.

use std::fmt;
use std::io::Write;
use std::sync::OnceLock;

use vramtrace_models::units::parse_bytes;

/// Device count variable.
pub(crate) const DEVICES_VAR: &str = "VRAMTRACE_FAKE_DEVICES";
/// Capacity variable: one byte count, or a comma-separated list (one per device).
pub(crate) const CAPACITY_VAR: &str = "VRAMTRACE_FAKE_CAPACITY";
/// Device name variable.
pub(crate) const NAME_VAR: &str = "VRAMTRACE_FAKE_NAME";

/// Capacity of each device when nothing is configured.
pub(crate) const DEFAULT_CAPACITY: u64 = 24 << 30;
/// Device name when nothing is configured.
pub(crate) const DEFAULT_NAME: &str = "vramtrace stand-in GPU";
/// Most devices the stand-in simulates (each gets its own address range).
pub(crate) const MAX_DEVICES: usize = 8;
/// Largest capacity of one device (large enough to mean "never runs out");
/// the address range of a device is twice this.
pub(crate) const MAX_CAPACITY: u64 = 4 << 40;
/// Longest device name, in bytes (`cuDeviceGetName` buffers are usually 256).
const MAX_NAME_LEN: usize = 255;

/// One simulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceConfig {
    /// What `cuDeviceGetName` returns.
    pub name: String,
    /// Bytes of device memory: `cuDeviceTotalMem` and the out-of-memory limit.
    pub capacity: u64,
}

/// The whole simulated machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// The devices, by ordinal. Empty means `cuInit` reports no device.
    pub devices: Vec<DeviceConfig>,
}

/// A variable that could not be understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConfigError {
    variable: &'static str,
    value: String,
    reason: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "vramtrace stand-in libcuda: {}={:?} is not valid: {}; cuInit returns CUDA_ERROR_INVALID_VALUE",
            self.variable, self.value, self.reason
        )
    }
}

impl Config {
    /// Reads the configuration through `lookup` (the environment, in production).
    /// Unset and empty variables take their defaults.
    pub(crate) fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let get = |var: &'static str| lookup(var).filter(|v| !v.trim().is_empty());
        let error = |variable, value: &str, reason| ConfigError {
            variable,
            value: value.to_owned(),
            reason,
        };

        let count = match get(DEVICES_VAR) {
            None => None,
            Some(text) => match text.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => Some(n),
                _ => {
                    return Err(error(
                        DEVICES_VAR,
                        &text,
                        "expected a device count from 0 to 8",
                    ));
                }
            },
        };

        let capacities = match get(CAPACITY_VAR) {
            None => vec![DEFAULT_CAPACITY],
            Some(text) => {
                let mut list = Vec::new();
                for item in text.split(',') {
                    match parse_bytes(item).ok() {
                        Some(bytes) if bytes > 0 && bytes <= MAX_CAPACITY => list.push(bytes),
                        _ => {
                            return Err(error(
                                CAPACITY_VAR,
                                &text,
                                "expected byte counts from 1 byte to 4 TiB such as 25769803776, 24GiB, 23.5GiB, 512MiB or 80GB, comma-separated for several devices",
                            ));
                        }
                    }
                }
                list
            }
        };

        // A list of capacities also sets the device count when the count is not given.
        let count = count.unwrap_or(capacities.len());
        if capacities.len() > 1 && capacities.len() != count {
            return Err(error(
                CAPACITY_VAR,
                &lookup(CAPACITY_VAR).unwrap_or_default(),
                "the list must have one capacity per device (see VRAMTRACE_FAKE_DEVICES)",
            ));
        }

        let name = match get(NAME_VAR) {
            None => DEFAULT_NAME.to_owned(),
            Some(name) if name.len() <= MAX_NAME_LEN => name,
            Some(name) => return Err(error(NAME_VAR, &name, "names are limited to 255 bytes")),
        };

        let devices = (0..count)
            .map(|ordinal| DeviceConfig {
                name: name.clone(),
                capacity: if capacities.len() == 1 {
                    capacities[0]
                } else {
                    capacities[ordinal]
                },
            })
            .collect();
        Ok(Config { devices })
    }
}

/// The process's configuration, read from the environment on first use. An
/// invalid variable is reported on stderr once, on the first call.
pub(crate) fn get() -> Result<&'static Config, &'static ConfigError> {
    static CONFIG: OnceLock<Result<Config, ConfigError>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let config = Config::from_lookup(|var| std::env::var(var).ok());
            if let Err(error) = &config {
                // stderr only: stdout belongs to the traced program.
                let _ = writeln!(std::io::stderr(), "{error}");
            }
            config
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_lookup(|var| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        })
    }

    /// The capacities `VRAMTRACE_FAKE_CAPACITY` accepts are those of the models crate's
    /// `parse_bytes`, the parser the CLI's `--capacity` uses too.
    #[test]
    fn byte_counts_with_and_without_units() {
        let bytes = |s: &str| parse_bytes(s).ok();
        assert_eq!(bytes("25769803776"), Some(24 << 30));
        assert_eq!(bytes("24GiB"), Some(24 << 30));
        assert_eq!(bytes("24 gib"), Some(24 << 30));
        assert_eq!(bytes("24G"), Some(24 << 30));
        assert_eq!(bytes("512MiB"), Some(512 << 20));
        assert_eq!(bytes("80GB"), Some(80_000_000_000));
        assert_eq!(bytes("141gb"), Some(141_000_000_000));
        assert_eq!(bytes("4096B"), Some(4096));
        assert_eq!(bytes("1TiB"), Some(1 << 40));
        assert_eq!(bytes("1.5GiB"), Some(3 << 29));
        assert_eq!(bytes(""), None);
        assert_eq!(bytes("GiB"), None);
        assert_eq!(bytes("-1"), None);
        assert_eq!(bytes("12 parsecs"), None);
        assert_eq!(bytes("99999999999TiB"), None);
    }

    #[test]
    fn fractional_capacities_are_accepted() {
        let config = parse(&[(CAPACITY_VAR, "23.5GiB")]).unwrap();
        assert_eq!(config.devices[0].capacity, 25_232_932_864);
        let config = parse(&[(CAPACITY_VAR, "1.5GiB, 0.5TiB")]).unwrap();
        let capacities: Vec<u64> = config.devices.iter().map(|d| d.capacity).collect();
        assert_eq!(capacities, vec![1_610_612_736, 1 << 39]);
        assert_eq!(
            parse(&[(CAPACITY_VAR, "4.5TiB")]).unwrap_err().variable,
            CAPACITY_VAR
        );
    }

    #[test]
    fn defaults_give_one_24_gib_device() {
        let config = parse(&[]).unwrap();
        assert_eq!(
            config.devices,
            vec![DeviceConfig {
                name: DEFAULT_NAME.into(),
                capacity: 24 << 30
            }]
        );
    }

    #[test]
    fn one_capacity_applies_to_every_device() {
        let config = parse(&[
            (DEVICES_VAR, "3"),
            (CAPACITY_VAR, "80GB"),
            (NAME_VAR, "NVIDIA H100"),
        ])
        .unwrap();
        assert_eq!(config.devices.len(), 3);
        assert!(
            config
                .devices
                .iter()
                .all(|d| d.capacity == 80_000_000_000 && d.name == "NVIDIA H100")
        );
    }

    #[test]
    fn a_capacity_list_sets_each_device_and_the_count() {
        let config = parse(&[(CAPACITY_VAR, "24GiB, 141GB")]).unwrap();
        let capacities: Vec<u64> = config.devices.iter().map(|d| d.capacity).collect();
        assert_eq!(capacities, vec![24 << 30, 141_000_000_000]);
        assert!(parse(&[(DEVICES_VAR, "2"), (CAPACITY_VAR, "1GiB,2GiB")]).is_ok());
        assert_eq!(
            parse(&[(CAPACITY_VAR, "4TiB")]).unwrap().devices[0].capacity,
            4 << 40
        );
    }

    #[test]
    fn zero_devices_is_allowed() {
        assert_eq!(parse(&[(DEVICES_VAR, "0")]).unwrap().devices, vec![]);
    }

    #[test]
    fn bad_values_name_their_variable() {
        let error = parse(&[(CAPACITY_VAR, "lots")]).unwrap_err();
        assert_eq!(error.variable, CAPACITY_VAR);
        assert!(error.to_string().starts_with(
            "vramtrace stand-in libcuda: VRAMTRACE_FAKE_CAPACITY=\"lots\" is not valid"
        ));
        assert!(!error.to_string().contains('\n'));
        assert_eq!(
            parse(&[(CAPACITY_VAR, "0")]).unwrap_err().variable,
            CAPACITY_VAR
        );
        assert_eq!(
            parse(&[(CAPACITY_VAR, "5TiB")]).unwrap_err().variable,
            CAPACITY_VAR
        );
        assert_eq!(
            parse(&[(DEVICES_VAR, "two")]).unwrap_err().variable,
            DEVICES_VAR
        );
        assert_eq!(
            parse(&[(DEVICES_VAR, "9")]).unwrap_err().variable,
            DEVICES_VAR
        );
        assert_eq!(
            parse(&[(DEVICES_VAR, "3"), (CAPACITY_VAR, "1GiB,2GiB")])
                .unwrap_err()
                .variable,
            CAPACITY_VAR
        );
        assert_eq!(
            parse(&[(NAME_VAR, &"x".repeat(256))]).unwrap_err().variable,
            NAME_VAR
        );
    }
}
