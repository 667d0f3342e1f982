//! The send and receive streams of the composed lowerings.

use safemlx::{Device, DeviceType, Stream};

/// The two streams the compositions move bytes on, one pair per group.
#[derive(Debug)]
pub(crate) struct P2pStreams {
    pub(super) send: Stream,
    pub(super) recv: Stream,
}

impl P2pStreams {
    pub(crate) fn new() -> Self {
        let cpu = Device::new(DeviceType::Cpu, 0);
        Self {
            send: Stream::new_with_device(&cpu),
            recv: Stream::new_with_device(&cpu),
        }
    }
}
