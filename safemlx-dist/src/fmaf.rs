//! A faster `fmaf` for MLX's CPU kernels.
//!
//! MLX's scalar CPU kernels on x86-64 Linux (`exp` in `softmax`,
//! `sigmoid`, `silu`) call the C function `fmaf` once per element. In a
//! Rust program that symbol resolves to `compiler_builtins`' copy, which
//! reaches the FMA instruction through two calls and a function pointer;
//! measured on the project's machine, 40% of a one-rank prefill's samples
//! were in `exp` (21%) and those two calls (19%). This crate's `fmaf` (the
//! linker takes it over `compiler_builtins`' weak one) runs the
//! instruction in one call where the CPU has FMA and `libm`'s exact
//! software version where it does not: the same correctly rounded
//! results, faster (`softmax` of `[9, 512, 512]` 1.28x, `sigmoid` of
//! `[512, 1536]` 1.21x, SmolLM2's prefill 1.12x to 1.25x; see the book's
//! "Design notes").

use std::sync::atomic::{AtomicU8, Ordering};

/// Whether the CPU has FMA: 0 not known yet, 1 yes, 2 no.
static HAS_FMA: AtomicU8 = AtomicU8::new(0);

/// `x * y + z` rounded once, as C's `fmaf`.
#[no_mangle]
pub extern "C" fn fmaf(x: f32, y: f32, z: f32) -> f32 {
    if HAS_FMA.load(Ordering::Relaxed) == 1 {
        // SAFETY: 1 is stored only where the CPU has FMA.
        unsafe { with_instruction(x, y, z) }
    } else {
        first_or_without(x, y, z)
    }
}

/// The first call's detection, and every call's work on a CPU without FMA.
#[cold]
#[inline(never)]
fn first_or_without(x: f32, y: f32, z: f32) -> f32 {
    let has = std::arch::is_x86_feature_detected!("fma");
    HAS_FMA.store(if has { 1 } else { 2 }, Ordering::Relaxed);
    if has {
        // SAFETY: the CPU has FMA (detected above).
        unsafe { with_instruction(x, y, z) }
    } else {
        libm::fmaf(x, y, z)
    }
}

/// Names this `fmaf` from code every program runs, so that the linker,
/// which reads this crate before MLX's library, has taken it by the time
/// MLX's kernels ask for `fmaf` (otherwise `compiler_builtins`' copy,
/// linked last, would serve them).
pub(crate) fn keep_linked() {
    std::hint::black_box(fmaf as extern "C" fn(f32, f32, f32) -> f32);
}

/// # Safety
/// The CPU must have FMA.
#[target_feature(enable = "fma")]
unsafe fn with_instruction(x: f32, y: f32, z: f32) -> f32 {
    x.mul_add(y, z)
}

#[cfg(test)]
mod tests {
    use super::fmaf;

    #[test]
    fn rounds_once_like_the_exact_software_version() {
        // (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24: two roundings (the product
        // to f32 first) would lose the 2^-24.
        let a = 1.0 + f32::EPSILON * 2048.0;
        assert_eq!(fmaf(a, a, -1.0), 2f32.powi(-11) + 2f32.powi(-24));
        assert_ne!(a * a - 1.0, fmaf(a, a, -1.0));
        let cases = [
            (0.1f32, 10.0f32, -1.0f32),
            (1e30, 1e10, -f32::INFINITY),
            (f32::NAN, 1.0, 0.0),
            (-0.0, 0.0, -0.0),
            (f32::MAX, 2.0, -f32::MAX),
            (1e-40, 1e-5, 0.0),
            (3.0, -7.25, 21.75),
        ];
        for (x, y, z) in cases {
            let (ours, exact) = (fmaf(x, y, z), libm::fmaf(x, y, z));
            assert!(
                ours.to_bits() == exact.to_bits() || (ours.is_nan() && exact.is_nan()),
                "fmaf({x:e}, {y:e}, {z:e}) = {ours:e}, libm: {exact:e}"
            );
        }
    }
}
