#include <iostream>
int main() { std::cout << "tessera\n"; }
