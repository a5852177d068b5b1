//! Stays in the shell: it needs the actor, its store and the push sink (a
//! subscription handled while a record's write waits for durability).

use super::*;

/// A push sink that records what it is offered: (device, sequence, endpoint).
#[derive(Default)]
struct Offers(std::sync::Mutex<Vec<(String, u64, String)>>);

impl relay_core::push::PushSink for Offers {
    fn offer(&self, job: relay_core::push::PushJob) {
        self.0.lock().unwrap().push((job.device_id, job.sequence, job.subscription.endpoint));
    }
}

/// The record's pushes go to the subscriptions its devices had when it was
/// written: a `push.subscribe` handled between the record's write and its
/// notification (sent once the write is durable) gets no push for it.
#[actix_rt::test]
async fn a_subscription_made_after_a_record_was_written_gets_no_push_for_it() {
    use crate::account::{stream_id, AccountCmd};
    use crate::delivery::NoPeers;
    use crate::store::{Head, NewEvent, Store};
    use crate::Supervisor;
    use relay_core::clock::ManualClock;
    use std::sync::Arc;

    let store = Store::temporary().unwrap();
    let events: Vec<NewEvent> = alice_history()
        .iter()
        .map(|e| NewEvent::new(e.event_type(), AccountEvent::VERSION, UnixSecs(NOW), e).unwrap())
        .collect();
    let mut batch = store.batch();
    batch.append(&stream_id(&alice().id), Head::default(), events);
    store.commit_durable_blocking(batch).unwrap();
    let sup = Supervisor::new(store, POLICY.clone(), ManualClock::at_ms(NOW * 1000), Arc::new(NoPeers));
    let offers = Arc::new(Offers::default());
    sup.set_push_sink(offers.clone());
    let id = alice().id;
    // Phone → Alice herself, readable by the laptop (the sending phone gets no push).
    let self_send = |n: u32| {
        let v = alice_to_self(n, &["phone", "laptop"]);
        AccountCmd::MessageSend { device: "phone".into(), params: parse(&v), digest: digest(&v), route: None }
    };
    let subscribe = AccountCmd::PushSubscribe { device: "laptop".into(), params: push_params(1) };

    // Both asked before either is answered: the actor handles the subscription
    // while record 1's reply and notification wait for durability.
    let (sent, subscribed) = futures_util::future::join(sup.ask(&id, self_send(1)), sup.ask(&id, subscribe)).await;
    sent.unwrap();
    subscribed.unwrap();
    // A later record, written with the subscription in place, is pushed.
    sup.ask(&id, self_send(2)).await.unwrap();
    // Its notification is published before this command is handled.
    sup.ask(&id, AccountCmd::AccountDevicesGet).await.unwrap();
    let endpoint = "https://push.example/sub/1".to_string();
    assert_eq!(*offers.0.lock().unwrap(), [("laptop".to_string(), 2, endpoint)]);
}
