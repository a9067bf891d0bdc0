// Package place decides which member runs a name in Spread mode:
// rendezvous hashing, a pure function of the members' IDs that every
// replica of every version sharing a group computes alike.
package place
