// The relay web client's service worker: Web Push (PROTOCOL §9).
//
// A push carries only {type: "timeline.changed", account_id, sequence}
// (encrypted by the relay for this browser's subscription, RFC 8291); it
// never carries a message, its sender or any content. So the notification
// says only "New message"; a click opens (or focuses) the client, which
// then syncs its timeline over the WebSocket and decrypts there.

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

/** The payload of a push, or {} when it is not ours. */
function payloadOf(event) {
  try {
    const p = event.data ? event.data.json() : {};
    return p && p.type === 'timeline.changed' ? p : {};
  } catch {
    return {};
  }
}

self.addEventListener('push', (event) => {
  const p = payloadOf(event);
  event.waitUntil(
    self.registration.showNotification('New message', {
      body: 'Open to read it.',
      // One notification per account: a newer push replaces it.
      tag: `relay-${p.account_id ?? 'timeline'}`,
      renotify: true,
      data: { account_id: p.account_id ?? null, sequence: p.sequence ?? null },
    }),
  );
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  event.waitUntil(
    (async () => {
      const windows = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
      for (const w of windows) {
        // An open client syncs at once (it may be between reconnects).
        w.postMessage({ type: 'push.open', ...event.notification.data });
        if ('focus' in w) return w.focus();
      }
      return self.clients.openWindow('/');
    })(),
  );
});
