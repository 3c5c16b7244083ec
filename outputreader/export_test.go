package outputreader

// SetListPageSize sets the listing page size and returns the undo.
func SetListPageSize(n int) func() {
	old := listPageSize
	listPageSize = n
	return func() { listPageSize = old }
}
