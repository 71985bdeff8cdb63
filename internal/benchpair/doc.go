// Package benchpair measures a case against its baseline in one benchmark, for quiesce's
// performance budgets: the two run alternately, block by block, so that the noise of a
// shared machine falls on both, and the budget is the median ratio of their times (see
// CONTRIBUTING.md, "Benchmarks"). Only quiesce's benchmarks import it.
package benchpair
