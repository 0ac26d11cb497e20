from mythic.cli import main

main()
