// The relay web client's service worker: Web Push (PROTOCOL §9).
//
// A push carries only {type: "timeline.changed", account_id, sequence}
// (encrypted by the relay for this browser's subscription, RFC 8291); it
// never carries a message, its sender or any content. So the notification
// says only "New message"; a click opens (or focuses) the client, which
// then syncs its timeline over the WebSocket and decrypts there.

//
// It also keeps the page itself: the app shell is cached at install and
// served when the relay cannot be reached, so a reload while offline still
// shows the conversations and the outbox (messages queued in IndexedDB).

const SHELL = 'relay-shell-v1';
const SHELL_PATHS = ['/', '/app.js', '/client.json'];

self.addEventListener('install', (event) => {
  event.waitUntil(
    caches
      .open(SHELL)
      .then((c) => c.addAll(SHELL_PATHS))
      .then(() => self.skipWaiting()),
  );
});
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

// Network first (a new relay version is served at once), the cache when the
// relay is unreachable; a good answer refreshes the cache.
self.addEventListener('fetch', (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== 'GET' || url.origin !== self.location.origin) return;
  const path = url.pathname === '/index.html' ? '/' : url.pathname;
  if (!SHELL_PATHS.includes(path)) return;
  event.respondWith(
    fetch(event.request)
      .then((r) => {
        if (r.ok) {
          const copy = r.clone();
          event.waitUntil(caches.open(SHELL).then((c) => c.put(path, copy)));
        }
        return r;
      })
      .catch(() => caches.match(path).then((r) => r ?? Response.error())),
  );
});

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
