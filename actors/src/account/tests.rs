//! Rules of the account core, given(events) / when(command) / then(events or error).
