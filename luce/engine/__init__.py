"""Engine: scheduler, slots, pages, recurrent states, transactions, step builder."""
