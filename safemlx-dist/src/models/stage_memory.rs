//! Pipeline stages in proportion to the memory each rank offers, as exo
//! allocates layers: a machine with three times the free memory holds
//! three times the layers.

use safemlx::{Array, Stream};

use super::LayerSplit;
use crate::error::{Error, Result};
use crate::runtime::{self, Group};

/// Overrides the memory a rank reports: one size for every rank, or one per
/// rank separated by commas (`24GiB,8GiB`), in bytes or with a `KiB`,
/// `MiB`, `GiB` or `TiB` suffix. Without it a rank reports the memory its
/// operating system calls available.
pub const MEMORY_ENV: &str = "SAFEMLX_DIST_MEMORY";

/// The bytes rank `rank` offers: its entry of [`MEMORY_ENV`] when set, else
/// `MemAvailable` of `/proc/meminfo`.
///
/// ```
/// use safemlx_dist::models::parse_memory;
///
/// assert_eq!(parse_memory("3GiB,1GiB", 1)?, 1 << 30);
/// assert_eq!(parse_memory("512MiB", 3)?, 512 << 20);
/// assert_eq!(
///     parse_memory("3GiB,1GiB", 2).unwrap_err().to_string(),
///     "SAFEMLX_DIST_MEMORY=3GiB,1GiB gives 2 sizes but this is rank 2; give one size, or one per rank"
/// );
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
///
/// # Errors
/// A variable that does not parse, or no entry for this rank (named); no
/// `/proc/meminfo` to read.
pub fn available_memory(rank: usize) -> Result<u64> {
    if let Ok(text) = std::env::var(MEMORY_ENV) {
        return parse_memory(&text, rank);
    }
    let info = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
        Error::Setting(format!(
            "cannot read /proc/meminfo for the memory this rank offers ({e}); set {MEMORY_ENV}"
        ))
    })?;
    info.lines()
        .find_map(|line| {
            let kib = line
                .strip_prefix("MemAvailable:")?
                .trim()
                .strip_suffix("kB")?;
            kib.trim().parse::<u64>().ok().map(|k| k * 1024)
        })
        .ok_or_else(|| {
            Error::Setting(format!(
                "/proc/meminfo has no MemAvailable; set {MEMORY_ENV}"
            ))
        })
}

/// Rank `rank`'s size in a [`MEMORY_ENV`] value.
///
/// # Errors
/// A size that does not parse, or no entry for `rank`.
pub fn parse_memory(text: &str, rank: usize) -> Result<u64> {
    let sizes: Vec<&str> = text.split(',').map(str::trim).collect();
    let entry = match sizes.as_slice() {
        [one] => one,
        many => many.get(rank).ok_or_else(|| {
            Error::Setting(format!(
                "{MEMORY_ENV}={text} gives {} sizes but this is rank {rank}; give one size, or one per rank",
                many.len()
            ))
        })?,
    };
    let (number, unit) = entry
        .find(|c: char| !c.is_ascii_digit())
        .map_or((*entry, ""), |at| entry.split_at(at));
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => u32::MAX,
    };
    number
        .parse::<u64>()
        .ok()
        .filter(|_| shift != u32::MAX)
        .and_then(|n| n.checked_mul(1u64.checked_shl(shift)?))
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| {
            Error::Setting(format!(
                "{MEMORY_ENV}={text}: `{entry}` is not a positive size; give bytes or a size such as 24GiB or 512MiB"
            ))
        })
}

/// Every rank of `group`'s memory in MiB (at least 1), in rank order:
/// each rank reports `mine` bytes, one `all_gather`. As weights, they
/// split a stage's heads, columns and experts by each rank's memory
/// (`generate --tensor-split memory`; see `Weights::with_shares`).
///
/// # Errors
/// A collective's error.
pub fn memory_reports(group: &Group, mine: u64, s: &Stream) -> Result<Vec<u32>> {
    let mib = i32::try_from((mine >> 20).max(1)).unwrap_or(i32::MAX);
    let all = runtime::all_gather(&Array::from_slice(&[mib], &[1]), group, s)?;
    Ok(runtime::read_back::<i32>(&all, "memory reports")?
        .into_iter()
        .map(|m| u32::try_from(m.max(1)).unwrap_or(1))
        .collect())
}

/// The split of `world`'s ranks into stages of `tp` consecutive ranks, in
/// proportion to each stage's memory: every rank reports `mine` bytes (one
/// `all_gather` over `world`), and a stage weighs its least memory times
/// its rank count (each of its ranks holds a `1/tp` share of its layers).
/// Returns the split and every rank's report, in MiB.
///
/// # Errors
/// A `tp` that does not divide the world, or a collective's error.
pub fn split_by_memory(
    world: &Group,
    tp: usize,
    mine: u64,
    s: &Stream,
) -> Result<(LayerSplit, Vec<u32>)> {
    let n = world.size();
    if tp == 0 || n % tp != 0 {
        return Err(Error::Setting(format!(
            "stages of {tp} ranks do not divide a run of {n}"
        )));
    }
    let reports = memory_reports(world, mine, s)?;
    let weights = reports
        .chunks(tp)
        .map(|stage| {
            let least = stage.iter().copied().min().unwrap_or(1);
            least.saturating_mul(u32::try_from(tp).unwrap_or(u32::MAX))
        })
        .collect();
    Ok((LayerSplit::Weighted(weights), reports))
}
