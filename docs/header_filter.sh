#!/bin/sh
# Doxygen input filter for the public headers: the paragraph each header
# opens with becomes the file's documentation (Doxygen lists a file's
# functions only when the file is documented). Line numbers are kept.
name=$(basename "$1")
exec sed -e "1s|^/\\* |/** @file $name |" "$1"
