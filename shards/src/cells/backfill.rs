//! With backup on, an object gets its first base when it next opens (`crate::backup`); one
//! that is never opened again would be missing from the backup, and from a node restored whole
//! from it. So once after start, shard 0 looks for the objects that have a database and no base
//! in the backup yet (made before backup was turned on), and opens each in turn (a wake for its
//! alarms, which does nothing else to an object with none due): its open writes the base.

use std::rc::Rc;

use combd_kernel::fair::ClientKey;

use crate::job::Job;
use crate::object_key::ObjectKey;

use super::Cells;

/// Opens, one after the other, every object of the node that has no base in its backup yet.
pub(super) async fn run(cells: Rc<Cells>) {
    let state = cells.state.clone();
    let node = state.node().clone();
    let Some(backup) = node.backup.clone() else {
        return;
    };
    if state.id() != 0 || node.fleet.is_some() {
        return;
    }
    for app in node.apps.names() {
        let Some(app) = node.apps.get(app) else {
            continue;
        };
        let (name, data, backup) = (app.name(), node.settings.data_dir.clone(), backup.clone());
        let missing = state
            .on_thread(ClientKey::Local, move || {
                let Ok((names, _)) = crate::object_files::names(&data, name, None, usize::MAX)
                else {
                    return Vec::new();
                };
                names
                    .into_iter()
                    .filter(|n| {
                        let key = ObjectKey::new(name, n);
                        backup.target().bases(&key).is_ok_and(|b| b.is_empty())
                    })
                    .collect::<Vec<_>>()
            })
            .await;
        for object in missing {
            if state.draining() {
                return;
            }
            let (tx, answer) = async_channel::bounded(1);
            cells.submit(&app, &object, Job::alarms(tx));
            let _ = answer.recv().await;
        }
    }
}
