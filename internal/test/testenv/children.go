package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ChildrenOf lists a process's children (/proc/*/stat): what a launcher
// started in sessions of their own (torch 2.x's torchrun does so with each
// worker), which a signal to its process group misses.
func ChildrenOf(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			k, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			kids = append(kids, k)
		}
	}
	return kids
}

// Alive reports whether pid is a process that is not a zombie (nor dead).
func Alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}
