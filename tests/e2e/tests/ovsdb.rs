//! ferrovsd configured through OVSDB: a real ovsdb-server with the stock vswitch schema,
//! the real ovs-vsctl, and the command sequences of OVS-DPDK's documentation unchanged.

use ferrovs_e2e::ovsdb::*;
use ferrovs_e2e::*;

/// The harness itself: a fresh database, ovs-vsctl against it, a restart keeps the data.
#[test]
fn the_database_harness_works() {
    if !require(
        available(),
        "ovsdb-server, ovsdb-tool, ovs-vsctl and vswitch.ovsschema",
    ) {
        return;
    }
    let dir = run_dir("ovsdb-harness");
    let mut db = OvsdbServer::start(&dir);
    db.vsctl_no_wait(&[
        "add-br",
        "br0",
        "--",
        "set",
        "bridge",
        "br0",
        "datapath_type=netdev",
    ])
    .unwrap();
    assert_eq!(db.get("Bridge", "br0", "datapath_type").unwrap(), "netdev");
    db.kill();
    assert!(db.vsctl_no_wait(&["show"]).is_err());
    db.run();
    assert_eq!(db.vsctl_no_wait(&["list-br"]).unwrap().trim(), "br0");
}
