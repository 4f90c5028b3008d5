//! Messages between objects on their way (`Cx::send_to_object`): a message leaves its sender's
//! outbox once the commit that queued it is durable, goes through the receiver's mailbox like
//! any input, and once the receiver's batch that took it is durable, the sender is told and
//! drops it from its outbox (and sends the next one for that receiver). A receiver that is not
//! there, refuses (a full mailbox) or fails leaves it in the outbox: sent again after a
//! backoff, never dropped; one taken twice (sent again before its acknowledgement came back) is
//! recognised by the receiver and not applied again.

use std::rc::Rc;

use crate::job::Job;
use crate::stats::ShardStats;

use super::Cells;

impl Cells {
    /// Sends message `id` of `from`'s outbox (`app/name`) to object `name` of `app`.
    pub(super) fn deliver_to_object(
        self: &Rc<Self>,
        from: &str,
        app: String,
        name: String,
        id: i64,
        body: Vec<u8>,
    ) {
        let node = self.state.node();
        // The outbox is the sender's database: checked again here, never trusted.
        if !crate::app::valid_object_name(&name) {
            tracing::warn!(object = %from, "an outbox message to an invalid object name: not sent");
            return;
        }
        let (Some(to), Some((from_app, from_name))) = (node.apps.get(&app), from.split_once('/'))
        else {
            // No such app now (a module removed): the sender sends it again later.
            return;
        };
        let Some(sender) = node.apps.get(from_app) else {
            return;
        };
        let (from_app, from_name) = (from_app.to_string(), from_name.to_string());
        let (tx, rx) = async_channel::bounded(1);
        self.submit(
            &to,
            &name,
            Job::from_object((from_app.clone(), from_name.clone(), id), body, false, tx),
        );
        ShardStats::add(&self.state.stats().object_messages_sent, 1);
        let cells = self.clone();
        let told = self.state.spawn(async move {
            let Ok(resp) = rx.recv().await else { return };
            if resp.status != 200 {
                return;
            }
            let stats = cells.state.stats();
            match serde_json::from_slice::<serde_json::Value>(&resp.body) {
                Ok(v) if v["taken"] == true => ShardStats::add(&stats.object_messages_taken, 1),
                _ => ShardStats::add(&stats.object_messages_taken_again, 1),
            }
            cells.submit(&sender, &from_name, Job::delivered(app, name, id));
        });
        if let Ok(t) = told {
            t.detach();
        }
    }
}
