//! The bucket the examples use, from `COMBD_FLEET_TEST_S3=endpoint,bucket,region,access_key,
//! secret_key` (`tools/fleet-env/up DIR` writes it into DIR/env).

use combd_fleet::bucket::{Bucket, BucketConfig};

/// The bucket `COMBD_FLEET_TEST_S3` names; panics with the expected form if it is not set.
pub fn bucket() -> Bucket {
    let spec = std::env::var("COMBD_FLEET_TEST_S3")
        .expect("COMBD_FLEET_TEST_S3=endpoint,bucket,region,access_key,secret_key");
    let f: Vec<&str> = spec.split(',').collect();
    assert_eq!(f.len(), 5, "COMBD_FLEET_TEST_S3 has five fields");
    Bucket::new(&BucketConfig {
        endpoint: f[0].into(),
        bucket: f[1].into(),
        region: f[2].into(),
        access_key: f[3].into(),
        secret_key: f[4].into(),
    })
    .unwrap()
    .with_fleet_key(std::sync::Arc::new(
        combd_fleet::auth::parse_fleet_key("combd-fleet-examples-key-0123456789abcdef").unwrap(),
    ))
}
