//! `safemlx` and `safemlx-dist` share MLX-C's one error handler; both must
//! keep reporting their own native errors exactly (see `runtime/native.rs`).
//!
//! One test in its own binary: it needs a process where the ring backend has
//! not been initialised yet, and no hostfile in the environment.

use safemlx::{Array, Device, DeviceType, Stream};
use safemlx_dist::{init, Backend, Error};

fn safemlx_add_error(stream: &Stream) -> String {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    let b = Array::from_slice(&[4.0f32, 5.0], &[2]);
    a.add(&b, stream)
        .expect_err("shapes (3) and (2) do not broadcast")
        .what()
        .to_owned()
}

#[test]
fn both_libraries_keep_their_native_error_messages() {
    assert!(
        std::env::var_os("MLX_HOSTFILE").is_none(),
        "run this test without MLX_HOSTFILE"
    );
    let stream = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));

    // safemlx reports its own error before we ever called native code.
    assert!(safemlx_add_error(&stream).contains("Shapes (3) and (2) cannot be broadcast"));

    // Our native call fails: MLX's own message reaches our error.
    let error = init(true, Backend::Ring).expect_err("strict ring init without a hostfile");
    let Error::Native { operation, message } = &error else {
        panic!("expected a native error, got {error:?}");
    };
    assert_eq!(*operation, "mlx_distributed_init");
    assert!(
        message.contains("MLX_HOSTFILE") || message.contains("hostfile"),
        "MLX's message is kept: {message:?}"
    );
    assert!(error
        .to_string()
        .starts_with("mlx_distributed_init failed: "));

    // safemlx still gets its own message, not ours, after our failure ...
    assert!(safemlx_add_error(&stream).contains("Shapes (3) and (2) cannot be broadcast"));

    // ... and after our success.
    let group = init(false, Backend::Ring).expect("non-strict init succeeds");
    assert_eq!(group.size(), 1);
    assert!(safemlx_add_error(&stream).contains("Shapes (3) and (2) cannot be broadcast"));

    // And our next native failure reports its own message, not a stale one
    // of safemlx's. (MLX caches the singleton now, so a strict init would
    // succeed: splitting a singleton is the failing native call here.)
    let split = group
        .split(0, None)
        .expect_err("a singleton does not split");
    let Error::Native { operation, message } = &split else {
        panic!("expected a native error, got {split:?}");
    };
    assert_eq!(*operation, "mlx_distributed_group_split");
    assert!(message.contains("split"), "{message}");
    assert!(!message.contains("Shapes"), "{message}");
    println!("{error}\n{split}");
}
