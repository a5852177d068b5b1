// The client's small pure rules, apart from the page so that they are
// tested in Node with a fixed clock (web/test/unit.mjs).

const DAY_MS = 86_400_000;

// Errors after which the same request may succeed later (PROTOCOL §2's
// retry rows, an expired session, and no connection at all): a message
// stays queued. Any other error is final for that message (✗, retry by hand).
const TRANSIENT = new Set([
  'offline', 'not_found', 'route_not_found', 'invalid_state', 'route_stale', 'target_not_local',
  'rate_limited', 'internal_error', 'bad_gateway', 'temporarily_unavailable', 'unauthorized',
]);
export const retryable = (code) => TRANSIENT.has(code ?? 'offline');

/** Local midnight before `ms`. */
const midnight = (ms) => {
  const d = new Date(ms);
  return new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
};

/** The day separator for a message at `ts` (Unix seconds), seen at `nowTs`. */
export function dayLabel(ts, nowTs) {
  const days = Math.round((midnight(nowTs * 1000) - midnight(ts * 1000)) / DAY_MS);
  if (days === 0) return 'Today';
  if (days === 1) return 'Yesterday';
  return new Date(ts * 1000).toLocaleDateString([], { weekday: 'short', year: 'numeric', month: 'short', day: 'numeric' });
}

/** A message's time of day. */
export const clockTime = (ts) => new Date(ts * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });

/** The conversation list's time: the time today, the date before. */
export const listTime = (ts, nowTs) =>
  dayLabel(ts, nowTs) === 'Today' ? clockTime(ts) : new Date(ts * 1000).toLocaleDateString([], { month: 'short', day: 'numeric' });
