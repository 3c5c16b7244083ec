package store_test

import (
	"fmt"

	"github.com/kfelastic/kfelastic/master/store"
)

// The master's loop applies each relayed operation, wakes waiters on the keys
// it touched, logs the changes, and answers retries from the session.
func Example() {
	st := store.New(store.Limits{}) // defaults

	// c10d's rendezvous setup: create the state key if nobody has.
	key := "/torch.rendezvous.job-1"
	res, touched, _ := st.Apply("node-0/conn-1", 1, store.Op{
		Kind: store.CompareSet, Key: key, Desired: []byte("Y2FuaW1hZGFt"),
	})
	fmt.Printf("%s, touched %q, ready %v\n", res.Value, touched, st.Ready([]string{key}))

	// A barrier counter; the reply was lost and the agent retries with the
	// same seq: counted once.
	for range 2 {
		res, _, _ = st.Apply("node-0/conn-1", 2, store.Op{Kind: store.Add, Key: "/barrier", Delta: 1})
		fmt.Println("barrier", res.Number)
	}

	// One batch for the durable log.
	kvs, sessions := st.TakeChanges()
	fmt.Println(len(kvs), "keys and", len(sessions), "session to log")

	_, _, err := st.Apply("", 0, store.Op{Kind: store.Get, Key: "/missing"})
	fmt.Println(err)
	// Output:
	// Y2FuaW1hZGFt, touched ["/torch.rendezvous.job-1"], ready true
	// barrier 1
	// barrier 1
	// 2 keys and 1 session to log
	// GET: store: key not found: "/missing"
}
