//! The only module of `safemlx-dist` with `unsafe` code: owned native group
//! handles, the MLX error handler, and one safe function per MLX-C call.
//!
//! Callers validate every argument before they get here (see `validate.rs`);
//! this module only keeps handles alive, turns status codes into errors
//! carrying MLX's own message, and hands results to `safemlx::Array`.
//!
//! # One error handler for two libraries
//!
//! MLX-C reports failures through a single, process-wide error handler.
//! `safemlx` installs its own exactly once (guarded by a `Once`) and keeps the
//! last message in a thread-local that only it can read. If we simply
//! installed ours, `safemlx` would lose its messages; if we installed ours
//! first, `safemlx`'s one-time installation would later replace it. So,
//! exactly once per process, we:
//!
//! 1. make `safemlx` install its handler (any `safemlx` call that reaches
//!    native code does; we ask for the allocator's active memory), then
//! 2. install `record_and_forward`, which stores the message in *our*
//!    thread-local and passes it on, unchanged, to `safemlx`'s exported
//!    `default_mlx_error_handler`.
//!
//! After that `safemlx`'s `Once` has fired and never installs again, we read
//! our own messages, and `safemlx` still reads its own: both libraries keep
//! exact error reporting, which `tests/error_handler.rs` checks.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Once;

use safemlx::{Array, Dtype, Stream};
use safemlx_dist_ffi as ffi;

use crate::error::{Error, Result};

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

unsafe extern "C" {
    /// `safemlx`'s error handler, exported unmangled by `safemlx::error`.
    fn default_mlx_error_handler(message: *const c_char, data: *mut c_void);
}

extern "C" fn record_and_forward(message: *const c_char, data: *mut c_void) {
    let text = if message.is_null() {
        String::from("MLX reported an error without a message")
    } else {
        // SAFETY: MLX passes a NUL-terminated string that lives for this call.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    };
    // `try_with`: never panic across the FFI boundary, even during thread exit.
    let _ = LAST_ERROR.try_with(|last| last.replace(Some(text)));
    // SAFETY: forwarding the exact arguments MLX gave us to the handler that
    // was installed before ours; it copies the message and returns.
    unsafe { default_mlx_error_handler(message, data) };
}

static INSTALL_HANDLER: Once = Once::new();

fn install_error_handler() {
    INSTALL_HANDLER.call_once(|| {
        // Step 1: let safemlx run its one-time installation now, so it can
        // never replace our handler later. The value itself is not needed.
        let _ = safemlx::memory::active_memory();
        // SAFETY: `record_and_forward` is a valid handler for the whole life
        // of the process and uses no user data, so there is nothing to free.
        unsafe {
            safemlx_sys::mlx_set_error_handler(Some(record_and_forward), std::ptr::null_mut(), None)
        };
    });
}

/// Runs one native call: clears any stale message first, then turns a
/// non-zero status into [`Error::Native`] with MLX's message.
fn call(operation: &'static str, native: impl FnOnce() -> c_int) -> Result<()> {
    install_error_handler();
    let _ = LAST_ERROR.try_with(|last| last.take());
    if native() == 0 {
        return Ok(());
    }
    let message = LAST_ERROR
        .try_with(|last| last.take())
        .ok()
        .flatten()
        .unwrap_or_else(|| String::from("MLX reported a failure without a message"));
    Err(Error::Native { operation, message })
}

/// Runs a native call that writes an array into `res`; on success the array
/// is handed to `safemlx`, on failure the placeholder is freed.
fn array_result(
    operation: &'static str,
    native: impl FnOnce(*mut ffi::mlx_array) -> c_int,
) -> Result<Array> {
    // SAFETY: creates an empty handle that the call below may overwrite.
    let mut res = unsafe { safemlx_sys::mlx_array_new() };
    match call(operation, || native(&mut res)) {
        // SAFETY: on success MLX-C stored a new reference in `res`; ownership
        // moves to the `Array`, whose `Drop` frees it.
        Ok(()) => Ok(unsafe { Array::from_ptr(res) }),
        Err(error) => {
            // SAFETY: `res` is ours (empty or partially set) and freed once.
            unsafe { safemlx_sys::mlx_array_free(res) };
            Err(error)
        }
    }
}

/// Owns one native `mlx_distributed_group`; freed on drop.
#[derive(Debug)]
pub(crate) struct NativeGroup(ffi::mlx_distributed_group);

impl Drop for NativeGroup {
    fn drop(&mut self) {
        // SAFETY: this is the only owner of a handle created by init/split.
        unsafe { ffi::mlx_distributed_group_free(self.0) };
    }
}

impl NativeGroup {
    /// Rank and size as MLX reports them.
    pub(crate) fn rank_and_size(&self) -> (c_int, c_int) {
        // SAFETY: `self.0` is a live group handle.
        unsafe {
            (
                ffi::mlx_distributed_group_rank(self.0),
                ffi::mlx_distributed_group_size(self.0),
            )
        }
    }

    fn from_call(
        operation: &'static str,
        native: impl FnOnce(*mut ffi::mlx_distributed_group) -> c_int,
    ) -> Result<Self> {
        // SAFETY: an empty handle for the call below to fill in.
        let mut res = unsafe { ffi::mlx_distributed_group_new() };
        match call(operation, || native(&mut res)) {
            Ok(()) => Ok(Self(res)),
            Err(error) => {
                if !res.ctx.is_null() {
                    // SAFETY: a handle MLX created before failing; freed once.
                    unsafe { ffi::mlx_distributed_group_free(res) };
                }
                Err(error)
            }
        }
    }
}

/// `mlx_distributed_is_available`; `None` asks about any backend.
pub(crate) fn is_available(name: Option<&CStr>) -> bool {
    let name = name.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: `name` is null or a NUL-terminated string alive for the call.
    unsafe { ffi::mlx_distributed_is_available(name) }
}

/// `mlx_distributed_init`; `None` lets MLX choose the backend.
pub(crate) fn init(strict: bool, name: Option<&CStr>) -> Result<NativeGroup> {
    let name = name.map_or(std::ptr::null(), CStr::as_ptr);
    NativeGroup::from_call("mlx_distributed_init", |res| {
        // SAFETY: `res` is a valid out-pointer, `name` null or NUL-terminated.
        unsafe { ffi::mlx_distributed_init(res, strict, name) }
    })
}

/// `mlx_distributed_group_split`.
pub(crate) fn split(group: &NativeGroup, color: c_int, key: c_int) -> Result<NativeGroup> {
    NativeGroup::from_call("mlx_distributed_group_split", |res| {
        // SAFETY: `res` is a valid out-pointer and `group` is alive.
        unsafe { ffi::mlx_distributed_group_split(res, group.0, color, key) }
    })
}

/// The collectives whose native signature is `(res, x, group, stream)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unary {
    AllSum,
    AllMax,
    AllMin,
    AllGather,
    SumScatter,
}

pub(crate) fn unary(op: Unary, x: &Array, group: &NativeGroup, s: &Stream) -> Result<Array> {
    let (name, native): (&'static str, unsafe extern "C" fn(_, _, _, _) -> c_int) = match op {
        Unary::AllSum => ("mlx_distributed_all_sum", ffi::mlx_distributed_all_sum),
        Unary::AllMax => ("mlx_distributed_all_max", ffi::mlx_distributed_all_max),
        Unary::AllMin => ("mlx_distributed_all_min", ffi::mlx_distributed_all_min),
        Unary::AllGather => (
            "mlx_distributed_all_gather",
            ffi::mlx_distributed_all_gather,
        ),
        Unary::SumScatter => (
            "mlx_distributed_sum_scatter",
            ffi::mlx_distributed_sum_scatter,
        ),
    };
    array_result(name, |res| {
        // SAFETY: `res` is a valid out-pointer; `x`, `group` and `s` are live
        // handles borrowed for the duration of the call.
        unsafe { native(res, x.as_ptr(), group.0, s.as_ptr()) }
    })
}

/// `mlx_distributed_all_to_all_v` with validated counts.
pub(crate) fn all_to_all_v(
    x: &Array,
    send_counts: &[i64],
    recv_counts: &[i64],
    group: &NativeGroup,
    s: &Stream,
) -> Result<Array> {
    array_result("mlx_distributed_all_to_all_v", |res| {
        // SAFETY: both count slices are alive and their lengths are passed
        // with them; the handles are live for the call.
        unsafe {
            ffi::mlx_distributed_all_to_all_v(
                res,
                x.as_ptr(),
                send_counts.as_ptr(),
                send_counts.len(),
                recv_counts.as_ptr(),
                recv_counts.len(),
                group.0,
                s.as_ptr(),
            )
        }
    })
}

/// `mlx_distributed_send` to a checked peer.
pub(crate) fn send(x: &Array, dst: c_int, group: &NativeGroup, s: &Stream) -> Result<Array> {
    array_result("mlx_distributed_send", |res| {
        // SAFETY: valid out-pointer and live handles.
        unsafe { ffi::mlx_distributed_send(res, x.as_ptr(), dst, group.0, s.as_ptr()) }
    })
}

/// `a >> b`, element-wise on integers (MLX's `right_shift`, which
/// `safemlx` does not wrap).
pub(crate) fn right_shift(a: &Array, b: &Array, s: &Stream) -> Result<Array> {
    array_result("mlx_right_shift", |res| {
        // SAFETY: valid out-pointer and live arrays and stream.
        unsafe { safemlx_sys::mlx_right_shift(res, a.as_ptr(), b.as_ptr(), s.as_ptr()) }
    })
}

/// `a & b`, element-wise on integers (MLX's `bitwise_and`).
pub(crate) fn bitwise_and(a: &Array, b: &Array, s: &Stream) -> Result<Array> {
    array_result("mlx_bitwise_and", |res| {
        // SAFETY: valid out-pointer and live arrays and stream.
        unsafe { safemlx_sys::mlx_bitwise_and(res, a.as_ptr(), b.as_ptr(), s.as_ptr()) }
    })
}

/// `mlx_distributed_recv` of a checked shape from a checked peer.
pub(crate) fn recv(
    shape: &[c_int],
    dtype: Dtype,
    src: c_int,
    group: &NativeGroup,
    s: &Stream,
) -> Result<Array> {
    array_result("mlx_distributed_recv", |res| {
        // SAFETY: `shape` is alive with its length; live handles.
        unsafe {
            ffi::mlx_distributed_recv(
                res,
                shape.as_ptr(),
                shape.len(),
                dtype.into(),
                src,
                group.0,
                s.as_ptr(),
            )
        }
    })
}

/// `mlx_distributed_recv_like` from a checked peer.
pub(crate) fn recv_like(
    like: &Array,
    src: c_int,
    group: &NativeGroup,
    s: &Stream,
) -> Result<Array> {
    array_result("mlx_distributed_recv_like", |res| {
        // SAFETY: valid out-pointer and live handles.
        unsafe { ffi::mlx_distributed_recv_like(res, like.as_ptr(), src, group.0, s.as_ptr()) }
    })
}

/// Ends the process now with `code`, running no exit handlers: OpenBLAS's
/// handler joins its worker threads and can deadlock in a rank that must
/// stop (the launcher watchdog's case).
pub(crate) fn exit_immediately(code: i32) -> ! {
    // SAFETY: `_exit` takes no pointers and never returns; skipping the
    // exit handlers is the point (nothing is flushed but what the caller did).
    unsafe { libc::_exit(code) }
}

/// A cotangent map: the gradient of an identity's input from the gradient
/// of its output.
pub(crate) type CotangentMap = Box<dyn Fn(&Array) -> Result<Array>>;

thread_local! {
    /// The error of the last cotangent map that failed on this thread: MLX
    /// sees only a non-zero status, the caller of the gradient reads this.
    static VJP_ERROR: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Takes the error a cotangent map left on this thread, if any.
pub(crate) fn take_vjp_error() -> Option<Error> {
    VJP_ERROR.try_with(|e| e.take()).ok().flatten()
}

unsafe extern "C" fn captured_forward(
    res: *mut safemlx_sys::mlx_vector_array,
    _input: safemlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    // SAFETY: `payload` is the `Array` boxed by `with_vjp`, alive until MLX
    // calls `drop_captured`; MLX-C passes a fresh output vector.
    unsafe {
        let output = &*(payload as *const Array);
        let vector = safemlx_sys::mlx_vector_array_new_value(output.as_ptr());
        let status = safemlx_sys::mlx_vector_array_set(res, vector);
        safemlx_sys::mlx_vector_array_free(vector);
        status
    }
}

unsafe extern "C" fn drop_captured(payload: *mut c_void) {
    // SAFETY: called once by MLX-C for the payload boxed in `with_vjp`.
    drop(unsafe { Box::from_raw(payload as *mut Array) });
}

unsafe extern "C" fn mapped_cotangent(
    res: *mut safemlx_sys::mlx_vector_array,
    _primals: safemlx_sys::mlx_vector_array,
    cotangents: safemlx_sys::mlx_vector_array,
    _outputs: safemlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    // SAFETY: `payload` is the `CotangentMap` boxed by `identity_with_vjp`,
    // alive until MLX calls `drop_cotangent_map`.
    let map = unsafe { &*(payload as *const CotangentMap) };
    // SAFETY: the identity has one output, so one cotangent; the handle
    // written into `c` is a new reference that the `Array` takes over.
    let cotangent = unsafe {
        let mut c = safemlx_sys::mlx_array_new();
        if safemlx_sys::mlx_vector_array_get(&mut c, cotangents, 0) != 0 {
            safemlx_sys::mlx_array_free(c);
            return 1;
        }
        Array::from_ptr(c)
    };
    match map(&cotangent) {
        Ok(grad) => {
            // SAFETY: `grad` stays alive across the copy into `res`.
            unsafe {
                let vector = safemlx_sys::mlx_vector_array_new_value(grad.as_ptr());
                let status = safemlx_sys::mlx_vector_array_set(res, vector);
                safemlx_sys::mlx_vector_array_free(vector);
                status
            }
        }
        Err(error) => {
            let _ = VJP_ERROR.try_with(|e| e.replace(Some(error)));
            1
        }
    }
}

unsafe extern "C" fn drop_cotangent_map(payload: *mut c_void) {
    // SAFETY: called once by MLX-C for the payload boxed below.
    drop(unsafe { Box::from_raw(payload as *mut CotangentMap) });
}

/// `x` unchanged, except that under autodiff its gradient is `vjp` of the
/// output's gradient (`mlx_custom_vjp` of the identity).
pub(crate) fn identity_with_vjp(x: &Array, vjp: CotangentMap) -> Result<Array> {
    with_vjp(x, x, vjp)
}

/// `y` (computed from `x`, its own gradient stopped) as a function of `x`
/// whose gradient is `vjp` of `y`'s gradient, of `x`'s shape
/// (`mlx_custom_vjp` of a function returning `y`).
pub(crate) fn with_vjp(x: &Array, y: &Array, vjp: CotangentMap) -> Result<Array> {
    let payload = Box::into_raw(Box::new(vjp)) as *mut c_void;
    let captured = Box::into_raw(Box::new(y.clone())) as *mut c_void;
    // SAFETY: every handle below is created here and freed exactly once;
    // the payloads are owned by their closures from their creation on
    // (their dtors).
    unsafe {
        let forward = safemlx_sys::mlx_closure_new_func_payload(
            Some(captured_forward),
            captured,
            Some(drop_captured),
        );
        let custom = safemlx_sys::mlx_closure_custom_new_func_payload(
            Some(mapped_cotangent),
            payload,
            Some(drop_cotangent_map),
        );
        let mut function = safemlx_sys::mlx_closure_new();
        let made = call("mlx_custom_vjp", || {
            safemlx_sys::mlx_custom_vjp(&mut function, forward, custom)
        });
        safemlx_sys::mlx_closure_free(forward);
        safemlx_sys::mlx_closure_custom_free(custom);
        if let Err(error) = made {
            safemlx_sys::mlx_closure_free(function);
            return Err(error);
        }
        let input = safemlx_sys::mlx_vector_array_new_value(x.as_ptr());
        let mut output = safemlx_sys::mlx_vector_array_new();
        let applied = call("mlx_closure_apply", || {
            safemlx_sys::mlx_closure_apply(&mut output, function, input)
        });
        safemlx_sys::mlx_vector_array_free(input);
        safemlx_sys::mlx_closure_free(function);
        let result = applied.and_then(|()| {
            array_result("mlx_vector_array_get", |res| {
                safemlx_sys::mlx_vector_array_get(res, output, 0)
            })
        });
        safemlx_sys::mlx_vector_array_free(output);
        result
    }
}
