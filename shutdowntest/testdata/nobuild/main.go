// Command nobuild does not compile: it stands for an operator with a type error.
package main

func main() {
	var n int = "not an int"
	_ = n
}
