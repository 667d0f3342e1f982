//! The single-process behaviour `spec/runtime.md` requires, with its exact
//! messages. Multi-rank behaviour is tested with real processes in `tests/`.

use safemlx::{Array, Device, DeviceType, Dtype, Stream};
use safemlx_dist::{
    all_gather, all_max, all_min, all_sum, all_to_all_v, init, is_available, recv, recv_like, send,
    sum_scatter, Backend, Error, Group,
};

fn cpu() -> Stream {
    Stream::new_with_device(&Device::new(DeviceType::Cpu, 0))
}

/// Ring without a hostfile cannot connect, so a non-strict init is a singleton.
fn singleton() -> Group {
    init(false, Backend::Ring).expect("non-strict init always gives a group")
}

fn values(array: &Array) -> Vec<f32> {
    array
        .evaluated()
        .expect("evaluates")
        .try_to_vec::<f32>()
        .expect("float32 data")
}

#[test]
fn backend_names_round_trip() {
    for (name, backend) in [
        ("any", Backend::Any),
        ("ring", Backend::Ring),
        ("mpi", Backend::Mpi),
        ("jaccl", Backend::Jaccl),
        ("nccl", Backend::Nccl),
    ] {
        assert_eq!(name.parse::<Backend>(), Ok(backend));
        assert_eq!(Backend::try_from(name), Ok(backend));
        assert_eq!(Backend::try_from(name.to_owned()), Ok(backend));
        assert_eq!(backend.as_str(), name);
        assert_eq!(backend.to_string(), name);
    }
}

#[test]
fn backend_names_with_nul_or_unknown_are_rejected() {
    assert_eq!(
        "ring\0x".parse::<Backend>().unwrap_err().to_string(),
        "distributed backend name contains an interior NUL byte"
    );
    assert_eq!(
        Backend::try_from("tcp").unwrap_err().to_string(),
        "unknown distributed backend \"tcp\"; expected any, ring, mpi, jaccl, or nccl"
    );
    assert_eq!(
        Backend::try_from(String::from("Ring")).unwrap_err(),
        Error::UnknownBackend {
            name: "Ring".into()
        }
    );
}

#[test]
fn ring_is_available_in_every_build() {
    assert!(is_available(Backend::Ring));
    assert!(is_available(Backend::Any));
}

#[test]
fn non_strict_init_without_peers_is_a_singleton() {
    let group = singleton();
    assert_eq!((group.rank(), group.size()), (0, 1));
    let debug = format!("{group:?}");
    assert_eq!(debug, "Group { rank: 0, size: 1 }");
    assert!(debug.contains("rank: 0") && debug.contains("size: 1"));
    let clone = group.clone();
    drop(group);
    assert_eq!(clone.size(), 1, "a clone keeps the shared handle alive");
}

#[test]
fn singleton_collectives_return_their_input() {
    let group = singleton();
    let stream = cpu();
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]);
    type Collective = fn(&Array, &Group, &Stream) -> safemlx_dist::Result<Array>;
    let ops: [(&str, Collective); 5] = [
        ("all_sum", |x, g, s| all_sum(x, g, s)),
        ("all_max", |x, g, s| all_max(x, g, s)),
        ("all_min", |x, g, s| all_min(x, g, s)),
        ("all_gather", |x, g, s| all_gather(x, g, s)),
        ("sum_scatter", |x, g, s| sum_scatter(x, g, s)),
    ];
    for (name, op) in ops {
        let y = op(&x, &group, &stream).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(y.shape(), &[2], "{name} shape");
        assert_eq!(y.dtype(), Dtype::Float32, "{name} dtype");
        assert_eq!(values(&y), [1.0, 2.0], "{name} values");
    }
}

#[test]
fn singleton_all_to_all_v_is_the_identity() {
    let group = singleton();
    let stream = cpu();
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let y = all_to_all_v(&x, &[3], &[3], &group, &stream).unwrap();
    assert_eq!(y.shape(), &[3, 2]);
    assert_eq!(values(&y), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);

    let empty = Array::from_slice::<f32>(&[], &[0, 3]);
    let y = all_to_all_v(&empty, &[0], &[0], &group, &stream).unwrap();
    assert_eq!(y.shape(), &[0, 3]);
    assert_eq!(y.dtype(), Dtype::Float32);
}

#[test]
fn all_to_all_v_rejects_bad_counts_with_exact_messages() {
    let group = singleton();
    let stream = cpu();
    let message = |x: &Array, send: &[usize], recv: &[usize]| {
        all_to_all_v(x, send, recv, &group, &stream)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let scalar = Array::from_f32(1.0);
    let rows = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    assert_eq!(
        message(&scalar, &[1], &[1]),
        "all_to_all_v input must have a leading row dimension"
    );
    assert_eq!(
        message(&rows, &[1, 2], &[3]),
        "all_to_all_v requires 1 send counts and receive counts, got 2 and 1"
    );
    assert_eq!(
        message(&rows, &[2], &[2]),
        "all_to_all_v send count sum 2 does not match input row count 3"
    );
    assert_eq!(
        message(&rows, &[3], &[2]),
        "all_to_all_v singleton send and receive counts must match"
    );
}

#[test]
fn singleton_split_is_a_singleton_or_an_error_about_split() {
    match singleton().split(0, None) {
        Ok(group) => assert_eq!(group.size(), 1),
        Err(error) => assert!(
            error.to_string().contains("split"),
            "unexpected split error: {error}"
        ),
    }
}

#[test]
fn point_to_point_rejects_a_singleton_and_negative_shapes() {
    let group = singleton();
    let stream = cpu();
    let x = Array::from_slice(&[1.0f32], &[1]);
    assert_eq!(
        send(&x, 0, &group, &stream).unwrap_err().to_string(),
        "cannot use a destination rank with a singleton distributed group"
    );
    assert_eq!(
        recv(&[1], Dtype::Float32, 0, &group, &stream)
            .unwrap_err()
            .to_string(),
        "cannot use a source rank with a singleton distributed group"
    );
    assert_eq!(
        recv_like(&x, 0, &group, &stream).unwrap_err().to_string(),
        "cannot use a source rank with a singleton distributed group"
    );
    assert_eq!(
        recv(&[2, -1], Dtype::Float32, 0, &group, &stream)
            .unwrap_err()
            .to_string(),
        "receive shape dimensions must be non-negative"
    );
}
