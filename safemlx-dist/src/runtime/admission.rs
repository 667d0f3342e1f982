//! Admission: only the processes of one run form its group.
//!
//! MLX's ring backend binds its ports with `SO_REUSEPORT` and takes the
//! first process that connects as the peer, so two runs given the same
//! ports join each other and compute wrong numbers, and any process that
//! reaches a port can take a rank's place. Each launch therefore gets a
//! secret ([`TOKEN_ENV`], in the ranks' environment, never on a command
//! line), and every rank proves it to its peers when the group is joined,
//! before any collective of the program:
//!
//! 1. each rank draws 32 random bytes (its nonce); an `all_gather` gives
//!    every rank all the nonces;
//! 2. each rank `r` sends `HMAC-SHA256(secret, CONTEXT ‖ size ‖ r ‖ nonces)`
//!    (`size` and `r` as little-endian `u32`); a second `all_gather` gives
//!    every rank every proof;
//! 3. each rank recomputes every other rank's proof with its own secret.
//!
//! The secret never travels, a proof is bound to this group's fresh nonces
//! and to the rank that made it (a recorded or copied proof is worthless),
//! and a rank of another run, a program given another secret or a foreign
//! process sending bytes all fail step 3 on every honest rank, which names
//! the rank and its address. A process that sends nothing is bounded by
//! the join timeout, as any peer that does not join.
//!
//! The two `all_gather`s are MLX's own and are not counted as the
//! program's collectives. MPI groups are assembled by `mpirun`, which
//! never mixes jobs, so there the secret is checked when it is set and not
//! required; every other backend finds its peers by address and requires it.

use hmac::{Hmac, Mac};
use safemlx::{Array, Device, DeviceType, Stream};
use sha2::Sha256;

use super::backend::Backend;
use super::contract::TOKEN_ENV;
use super::native::{self, NativeGroup, Unary};
use crate::error::{Error, Result};

/// The fewest characters a secret may have.
pub const MIN_TOKEN_LEN: usize = 16;
/// What every proof starts with (protocol and version).
pub const CONTEXT: &[u8] = b"safemlx-dist admission v1\0";
const NONCE: usize = 32;

/// A fresh secret for one run: 32 random bytes, as 64 hexadecimal digits.
///
/// # Errors
/// The system's random source failed.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(hex(&bytes))
}

/// `bytes` as lowercase hexadecimal digits, two per byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The secret from the environment, checked; `None` when unset.
fn token_from_env() -> Result<Option<Vec<u8>>> {
    let Some(value) = std::env::var_os(TOKEN_ENV) else {
        return Ok(None);
    };
    let bytes = value.into_encoded_bytes();
    if bytes.len() < MIN_TOKEN_LEN {
        return Err(Error::ShortToken { len: bytes.len() });
    }
    Ok(Some(bytes))
}

/// The MAC of rank `rank`'s proof over `nonces` in a group of `size`.
fn mac(secret: &[u8], size: usize, rank: usize, nonces: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(CONTEXT);
    mac.update(&u32::try_from(size).unwrap_or(u32::MAX).to_le_bytes());
    mac.update(&u32::try_from(rank).unwrap_or(u32::MAX).to_le_bytes());
    mac.update(nonces);
    mac
}

/// Rank `rank`'s proof over `nonces` in a group of `size`.
fn proof(secret: &[u8], size: usize, rank: usize, nonces: &[u8]) -> [u8; 32] {
    mac(secret, size, rank, nonces)
        .finalize()
        .into_bytes()
        .into()
}

/// Proves this rank's secret to its peers and checks theirs (see the
/// module's documentation). Runs on every rank of a group of several as
/// it is joined.
pub(crate) fn admit(group: &NativeGroup, rank: usize, size: usize, backend: Backend) -> Result<()> {
    let secret = token_from_env()?;
    if secret.is_none() && assembled_by_mpirun(backend) {
        return Ok(());
    }
    // A rank without the secret still takes part, so that its peers learn
    // at once that it has none instead of waiting for it.
    let key = secret.as_deref().unwrap_or_default();
    let stream = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce).map_err(|e| Error::Native {
        operation: "admission",
        message: format!("the system's random source failed: {e}"),
    })?;
    let nonces = gather(&nonce, group, size, &stream)?;
    let mine = proof(key, size, rank, &nonces);
    let proofs = gather(&mine, group, size, &stream)?;
    if secret.is_none() {
        return Err(Error::MissingToken { size });
    }
    for (peer, theirs) in proofs.chunks_exact(32).enumerate() {
        if peer == rank {
            continue;
        }
        // Constant-time comparison.
        if mac(key, size, peer, &nonces).verify_slice(theirs).is_err() {
            return Err(Error::NotAdmitted {
                rank: peer,
                address: address_of(peer),
            });
        }
    }
    Ok(())
}

/// Whether `mpirun` assembled the group: the MPI backend, or MLX's choice
/// in an MPI job without a ring hostfile.
fn assembled_by_mpirun(backend: Backend) -> bool {
    match backend {
        Backend::Mpi => true,
        Backend::Any => {
            std::env::var_os("MLX_HOSTFILE").is_none()
                && std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
        }
        _ => false,
    }
}

/// `all_gather` of `bytes` over the native group: every rank's bytes, in
/// rank order, checked to be `size` times as many.
fn gather(bytes: &[u8], group: &NativeGroup, size: usize, s: &Stream) -> Result<Vec<u8>> {
    let len = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
    let mine = Array::from_slice(bytes, &[len]);
    let all = native::unary(Unary::AllGather, &mine, group, s)?;
    let all = super::read_back::<u8>(&all, "admission")?;
    if all.len() != bytes.len() * size {
        return Err(Error::Native {
            operation: "admission",
            message: format!(
                "all_gather returned {} bytes for {size} ranks of {}",
                all.len(),
                bytes.len()
            ),
        });
    }
    Ok(all)
}

/// Where `rank` is, for messages: its first address in the ring's
/// hostfile, or a note for backends without one.
fn address_of(rank: usize) -> String {
    let listed = std::env::var_os("MLX_HOSTFILE")
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| serde_json::from_str::<Vec<Vec<String>>>(&text).ok())
        .and_then(|hosts| hosts.get(rank)?.first().cloned());
    listed.map_or_else(
        || "its address is not in a hostfile".to_owned(),
        |address| format!("at {address} in MLX_HOSTFILE"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_hex_and_proofs_bind_secret_rank_size_and_nonces() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        let nonces = [7u8; 64];
        let p = proof(a.as_bytes(), 2, 1, &nonces);
        assert_eq!(p, proof(a.as_bytes(), 2, 1, &nonces));
        assert_ne!(p, proof(b.as_bytes(), 2, 1, &nonces));
        assert_ne!(p, proof(a.as_bytes(), 2, 0, &nonces));
        assert_ne!(p, proof(a.as_bytes(), 3, 1, &nonces));
        assert_ne!(p, proof(a.as_bytes(), 2, 1, &[8u8; 64]));
        // The wire format, as the book's Python ranks compute it:
        // hmac.new(secret, CONTEXT + struct.pack("<II", 2, 1) + bytes(range(64)), sha256).
        let nonces: Vec<u8> = (0..64).collect();
        assert_eq!(
            hex(&proof(b"a secret of this run", 2, 1, &nonces)),
            "00bddf6a07c8240b05bd200432762faff6c60a19ac86cfa9c4f075a591f11b2d"
        );
        // RFC 4231, test case 2: HMAC-SHA256 itself, as Python's hmac computes it.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
