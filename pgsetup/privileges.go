package pgsetup

// MarkPrivileges returns the privileges the relay's role needs on the outbox
// table to write the dead-letter and halt marks, each as {privilege,
// column}: what Prepare checks at start. `outbox-relay check` and its grant
// block use the same list. Any goroutine; a fresh copy.
func MarkPrivileges() [][2]string {
	return append([][2]string(nil), markPrivileges...)
}
