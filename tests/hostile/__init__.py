"""The hostile-input suite: the real switch process on veth pairs in namespaces of its own."""
