// The browser's own storage (IndexedDB): keys, contacts, the timeline
// cursor and the messages this device has read. Keys never leave it except
// in a device-link answer, sealed to the user's own new device.

const DB = 'relay-web';

function req(r) {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

let db;
async function open() {
  if (!db) {
    const r = indexedDB.open(DB, 1);
    r.onupgradeneeded = () => {
      r.result.createObjectStore('kv');
      r.result.createObjectStore('messages', { keyPath: 'message_id' });
    };
    db = await req(r);
  }
  return db;
}

async function store(name, mode) {
  return (await open()).transaction(name, mode).objectStore(name);
}

export const get = async (key) => req((await store('kv', 'readonly')).get(key));
export const put = async (key, value) => req((await store('kv', 'readwrite')).put(value, key));
export const messages = async () => req((await store('messages', 'readonly')).getAll());
export const message = async (id) => req((await store('messages', 'readonly')).get(id));
export const putMessage = async (m) => req((await store('messages', 'readwrite')).put(m));
export const deleteMessage = async (id) => req((await store('messages', 'readwrite')).delete(id));

/** Forgets everything this browser kept (sign-out). */
export async function wipe() {
  if (db) {
    db.close();
    db = undefined;
  }
  await req(indexedDB.deleteDatabase(DB));
}
