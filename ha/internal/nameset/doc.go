// Package nameset is how a replica publishes the set of names it
// registers: deflated chunks of length-prefixed names, the same on every
// store.
package nameset
